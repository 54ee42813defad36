"""docs/performance.md from the JSON results of bench/run_all.sh: one section per host class
(AVX2, AVX-512, AMX). A run rewrites only the part of its own class's section that lies
between that class's markers, and redraws that class's charts under docs/img/; the other
classes' sections, and the text after a section's end marker, stay as they are.

    python -m bench.report.perf_doc [RESULTS] [--doc docs/performance.md]
                                    [--command CMD] [--date YYYY-MM-DD]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from bench.report.host_class import HOST_CLASSES, class_of, probe_line, recorded_host
from bench.report.results import (
    generate_section,
    kernel_section,
    rss_section,
    serve_section,
    server_pair_files,
    servers_section,
    spec_section,
    structured_spec_section,
)

DOC = Path("docs/performance.md")
TITLES = {"AVX2": "AVX2 hosts (AVX2, FMA, F16C; no AVX-512)",
          "AVX-512": "AVX-512 hosts (AVX-512 BF16; no AMX)",
          "AMX": "AMX hosts (AVX-512 BF16 and AMX tiles, granted by the OS)"}
HEADER = ["# Performance", "",
          "One section per host class. Every ratio compares figures measured in the same run "
          "on the same machine; absolute figures move with the machine's load. "
          "`bench/run_all.sh` rebuilds the section of the class it runs on "
          "(`python -m bench.report.perf_doc`); the rest of this file stays as it is.", ""]


def begin_marker(cls: str) -> str:
    return f"<!-- perf_doc {cls}: begin (rebuilt by bench/run_all.sh) -->"


def end_marker(cls: str) -> str:
    return f"<!-- perf_doc {cls}: end -->"


def slug(cls: str) -> str:
    return cls.lower().replace("-", "")


def _fmt(v: float | None, spec: str = "{:.2f}") -> str:
    return "-" if v is None else spec.format(v)


def _tok_s(v: float) -> str:
    return f"{v:.1f}" if v >= 20 else f"{v:.2f}"


def _llamacpp(run: dict[str, Any]) -> str | None:
    """The llama.cpp baseline the ratios name: the Q8_0 export first (what Ollama makes of
    an FP8 checkpoint), else any other that ran."""
    names = sorted(n for n in run["baselines"] if n.startswith("llamacpp"))
    return "llamacpp_q8_0" if "llamacpp_q8_0" in names else (names[0] if names else None)


def summary_table(runs: list[dict[str, Any]]) -> list[str]:
    """One row per generate run: fp8serve's decode and its ratios to llama.cpp,
    transformers, the bandwidth bound and (prefill) torch bf16 matmul."""
    head = ["model", "prompt / generated", "fp8serve decode tok/s", "x llama.cpp (decode)",
            "x transformers (decode)", "x its Python layers (decode)",
            "of the bandwidth bound (decode)", "prefill x torch bf16 matmul"]
    rows = []
    for g in runs:
        r, lname = g["ratios"], _llamacpp(g)
        lc_ratio = r.get(f"decode_vs_{lname}") if lname else None
        lc = "- (not run)" if lc_ratio is None else f"{lc_ratio:.2f} ({lname})"
        hf = g["baselines"].get("transformers", {})
        tr = (f"{_fmt(r.get('decode_vs_transformers'))} ({hf['dtype']})" if "dtype" in hf
              else "- (not run)")
        rows.append([f"{g['model']['name']} ({g['model']['num_layers']} layers)",
                     f"{g['config']['prompt_len']} / {g['config']['gen_len']}",
                     _tok_s(g["fp8serve"]["decode_tok_s"]), lc, tr,
                     _fmt(r.get("decode_vs_python_layers")),
                     _fmt(r.get("decode_vs_bandwidth_bound")),
                     _fmt(r.get("prefill_vs_bf16_matmul"))])
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def _load_all(results: Path, pattern: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, json.loads(p.read_text())) for p in sorted(results.glob(pattern))]


def _charts(results: Path, cls: str, img_dir: Path, doc_dir: Path) -> list[str]:
    """Draw this class's charts; the Markdown lines that show them (or say why not)."""
    from bench.kernels.plot import plot_rows
    from bench.report.charts import plot_decode

    lines = []
    kernels = results / "kernels.json"
    if kernels.is_file():
        png = img_dir / f"kernels-{slug(cls)}.png"
        why = plot_rows(json.loads(kernels.read_text())["rows"], png)
        lines += [f"Kernel chart: {why}" if why else
                  f"![ms per call against M, each kernel and torch bf16]"
                  f"({png.relative_to(doc_dir).as_posix()})", ""]
    gen = [g for _, g in _load_all(results, "generate-*.json")]
    if gen:
        png = img_dir / f"decode-{slug(cls)}.png"
        why = plot_decode(gen, png)
        lines += [f"Decode chart: {why}" if why else
                  f"![decode tok/s: fp8serve, llama.cpp, transformers, the bandwidth bound]"
                  f"({png.relative_to(doc_dir).as_posix()})", ""]
    return lines


def section_body(results: Path, cls: str, host: dict[str, Any], command: str, date: str,
                 img_dir: Path, doc_dir: Path, charts: bool = True) -> list[str]:
    """The lines between the class's markers: probe line, date, command, the summary
    table, the charts (unless ``charts`` is False), then every result table of the run."""
    lines = [f"Probe: `{probe_line(host)}`  ", f"Date: {date}  ", f"Command: `{command}`", ""]
    gen = [g for _, g in _load_all(results, "generate-*.json")]
    if gen:
        lines += ["### Summary (`fp8serve bench generate`, single stream, greedy)", ""]
        lines += summary_table(gen) + [""]
    lines += _charts(results, cls, img_dir, doc_dir) if charts else []
    if (results / "kernels.json").is_file():
        lines += kernel_section(json.loads((results / "kernels.json").read_text())) + [""]
    if gen:
        lines += generate_section(gen) + [""]
    for p, s in _load_all(results, "serve-*.json"):
        lines += serve_section(s, p.stem.removeprefix("serve-")) + [""]
    for p, name in server_pair_files(results):
        lines += servers_section(json.loads(p.read_text()), name) + [""]
    for p, s in _load_all(results, "spec-*.json"):
        lines += spec_section(s, p.stem.removeprefix("spec-")) + [""]
    for p, s in _load_all(results, "structured-spec-*.json"):
        lines += structured_spec_section(s, p.stem.removeprefix("structured-spec-")) + [""]
    rss = [r for _, r in _load_all(results, "rss-*.json")]
    if rss:
        lines += rss_section(rss) + [""]
    return lines


def replace_section(doc: str, cls: str, body: list[str]) -> str:
    """``doc`` with the text between ``cls``'s markers replaced by ``body``; a class with no
    markers yet gets a new section in HOST_CLASSES order (an empty doc gets the header)."""
    begin, end = begin_marker(cls), end_marker(cls)
    block = "\n".join([begin, *body, end])
    if begin in doc:
        head, _, rest = doc.partition(begin)
        if end not in rest:
            raise ValueError(f"docs/performance.md: {begin!r} without {end!r}")
        return head + block + rest.partition(end)[2]
    new = f"## {TITLES[cls]}\n\n{block}\n"
    later = [c for c in HOST_CLASSES[HOST_CLASSES.index(cls) + 1:]
             if f"## {TITLES[c]}" in doc]
    if not doc.strip():
        return "\n".join(HEADER) + "\n" + new
    if later:
        at = doc.index(f"## {TITLES[later[0]]}")
        return doc[:at] + new + "\n" + doc[at:]
    return doc.rstrip("\n") + "\n\n" + new


def rebuild(results: Path, doc_path: Path, command: str, date: str,
            charts: bool = True) -> str:
    """Rewrite ``doc_path``'s section for the class ``results`` was measured on (charts
    drawn under its img/ unless ``charts`` is False); returns the class."""
    host = recorded_host(results)
    cls = class_of(host["features"], host.get("dispatch_isa"))
    body = section_body(results, cls, host, command, date, doc_path.parent / "img",
                        doc_path.parent, charts)
    old = doc_path.read_text() if doc_path.is_file() else ""
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    doc_path.write_text(replace_section(old, cls, body))
    return cls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report.perf_doc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="?", default=Path("bench/results"))
    p.add_argument("--doc", type=Path, default=DOC)
    p.add_argument("--command", default="bash bench/run_all.sh",
                   help="how the results were made, as the section shows it")
    p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc)
                   .strftime("%Y-%m-%d"))
    args = p.parse_args(argv)
    try:
        cls = rebuild(args.results, args.doc, args.command, args.date)
    except ValueError as exc:
        p.error(str(exc))
    print(f"wrote the {cls} section of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
