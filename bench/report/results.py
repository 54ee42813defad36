"""The README results table: markdown built from the JSON files that bench/run_all.sh
writes into one directory (kernels.json, generate-*.json, serve-*.json,
llama-serve-*.json, flags-serve-*.json, rss-*.json).
Missing files are left out. ``python -m bench.report.results DIR`` prints it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GIB = 2**30


def _f(v: float | None, spec: str = "{:.1f}") -> str:
    return "-" if v is None else spec.format(v)


def _model_label(model: str | None) -> str:
    """A served model as the docs name it: the demo model, or its directory's name (never
    the path on the machine that ran the benchmark)."""
    from engine.demo_model import DEMO_NAME

    if not model:
        return "?"
    name = Path(model).name
    return "the demo model" if name == DEMO_NAME else f"`{name}`"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def generate_section(runs: list[dict[str, Any]]) -> list[str]:
    """One row per model: fp8serve prefill/decode and every ratio measured with it."""
    head = ["model", "threads", "prefill tok/s", "decode tok/s", "decode / bw bound",
            "prefill / bf16 matmul", "transformers decode", "x transformers (dec / pre)",
            "llama.cpp decode", "x llama.cpp (dec / pre)", "x Python layers (dec / pre)"]
    rows = []
    for g in runs:
        ours, r, b = g["fp8serve"], g["ratios"], g["baselines"]
        lname = "llamacpp_q8_0" if "llamacpp_q8_0" in b else "llamacpp"  # Q8_0 export first
        hf, lc = b.get("transformers", {}), b.get(lname, {})
        rows.append([
            f"{g['model']['name']} ({g['model']['num_layers']} layers)",
            str(g["host"]["torch_threads"]), _f(ours["prefill_tok_s"]),
            _f(ours["decode_tok_s"]),
            f"{r['decode_vs_bandwidth_bound']:.2f} of {g['bandwidth_bound']['decode_tok_s']:.1f}",
            f"{r['prefill_vs_bf16_matmul']:.2f}",
            _f(hf.get("decode_tok_s")) + (f" ({hf['dtype']})" if "dtype" in hf else ""),
            f"{_f(r.get('decode_vs_transformers'), '{:.2f}')} / "
            f"{_f(r.get('prefill_vs_transformers'), '{:.2f}')}",
            _f(lc.get("decode_tok_s")),
            f"{_f(r.get(f'decode_vs_{lname}'), '{:.2f}')} / "
            f"{_f(r.get(f'prefill_vs_{lname}'), '{:.2f}')}",
            f"{_f(r.get('decode_vs_python_layers'), '{:.2f}')} / "
            f"{_f(r.get('prefill_vs_python_layers'), '{:.2f}')}"])
    c = runs[0]["config"]
    return ([f"### Single stream (`fp8serve bench generate`, prompt {c['prompt_len']}, "
             f"{c['gen_len']} generated tokens, greedy)", ""] + _table(head, rows)
            + ["", "Bandwidth bound = read bandwidth measured in the same process / bytes "
                   "read per decode token (every FP8 weight byte + the lm_head + one "
                   "embedding row + norms). Python layers = the same runner with every "
                   "decoder layer in torch ops instead of the fused C++ op, in the same "
                   "interleaved rounds. '-' = baseline skipped or not run."]
            + _llamacpp_libraries(runs))


def _llamacpp_libraries(runs: list[dict[str, Any]]) -> list[str]:
    """One line per llama.cpp library the runs loaded: which, and what it reports."""
    seen = sorted({("llama-cpp-python's own" if "site-packages" in b["library"] else
                    "built for this host by `fp8serve bench llamacpp`", b["system_info"])
                   for g in runs for n, b in g["baselines"].items()
                   if n.startswith("llamacpp") and "system_info" in b})
    return [f"llama.cpp library: {which} (`{info}`)." for which, info in seen]


def serve_section(s: dict[str, Any], name: str) -> list[str]:
    """One row per concurrency level; with several rounds, each figure is the median over
    the level's rounds (``levels``, from bench/serve/run.py combine_rounds) and the
    rounds' throughputs are listed. JSON without ``levels`` has one run per level."""
    levels = s.get("levels") or s["runs"]
    rounds = max(r.get("rounds", 1) for r in levels)
    base = levels[0]["output_token_throughput"] or None
    head = ["concurrency", "output tok/s", "x concurrency 1", "TTFT p50 / p99 (s)",
            "ITL p50 / p99 (ms)", "failed"]
    if rounds > 1:
        head.insert(2, "each round")
    rows = []
    for r in levels:
        row = [str(r["config"]["concurrency"]), _f(r["output_token_throughput"]),
               _f(r["output_token_throughput"] / base if base else None, "{:.2f}"),
               f"{r['ttft_s']['p50']:.3f} / {r['ttft_s']['p99']:.3f}",
               f"{r['itl_s']['p50'] * 1e3:.1f} / {r['itl_s']['p99'] * 1e3:.1f}",
               str(r["failed"])]
        if rounds > 1:
            row.insert(2, ", ".join(f"{x:.1f}" for x in r["output_token_throughput_rounds"]))
        rows.append(row)
    c = levels[0]["config"]
    how = f", median of {rounds} interleaved rounds" if rounds > 1 else ""
    return ([f"### Serving `{name}` (`fp8serve bench serve`, {c['num_prompts']} prompts, "
             f"input {c['input_len']}, output {c['output_len']}{how})", ""]
            + _table(head, rows))


def servers_section(s: dict[str, Any], name: str) -> list[str]:
    """A two-server `bench serve` run (``--llama-server`` or ``--compare-server-arg``): per
    concurrency level each server's output tok/s (medians over the rounds), the first's
    ratio to the second and that ratio in each round, TTFT and ITL p50 / p99 of both; then
    what the two servers ran."""
    pair = s["comparison"]["servers"]
    if not pair:
        return []
    ours, theirs = pair[0]["url"], pair[0]["compare_url"]
    info = s.get("servers") or {}
    first = info.get(ours, {}).get("name", ours)
    label = info.get(theirs, {}).get("name", theirs)

    def level(url: str, conc: int) -> dict[str, Any]:
        return next(lv for lv in s["levels"]
                    if lv["config"]["url"] == url and lv["config"]["concurrency"] == conc)

    def both(a: dict[str, Any], b: dict[str, Any], metric: str, q: str, scale: float,
             spec: str) -> str:
        return f"{spec.format(a[metric][q] * scale)} / {spec.format(b[metric][q] * scale)}"

    rows = []
    for r in pair:
        conc = r["concurrency"]
        a, b = level(ours, conc), level(theirs, conc)
        each = [x / y if y else None for x, y in zip(a["output_token_throughput_rounds"],
                                                     b["output_token_throughput_rounds"],
                                                     strict=True)]
        rows.append([str(conc), _f(r["throughput"]), _f(r["throughput_compare"]),
                     _f(r["throughput_ratio"], "{:.2f}"),
                     ", ".join(_f(x, "{:.2f}") for x in each),
                     both(a, b, "ttft_s", "p50", 1, "{:.3f}"),
                     both(a, b, "ttft_s", "p99", 1, "{:.3f}"),
                     both(a, b, "itl_s", "p50", 1e3, "{:.1f}"),
                     both(a, b, "itl_s", "p99", 1e3, "{:.1f}"),
                     f"{a['failed']} / {b['failed']}"])
    c, rounds = s["levels"][0]["config"], s.get("rounds", 1)
    head = ["concurrency", f"{first} tok/s", f"{label} tok/s", "x", "x each round",
            "TTFT p50 (s)", "TTFT p99 (s)", "ITL p50 (ms)", "ITL p99 (ms)", "failed"]
    other = info.get(theirs, {})
    size = (f"{c['num_prompts']} prompts, input {c['input_len']}, output {c['output_len']}, "
            f"{rounds} interleaved rounds, medians")
    if "llama_cpp" in other:
        title = (f"### Serving `{name}` against {label} (`fp8serve bench serve "
                 f"--llama-server`, {size})")
        note = (f"{label}: llama.cpp {other.get('llama_cpp', '?')} built with "
                f"{other.get('built', '?')}, `{other.get('system_info') or '?'}`; "
                f"{other.get('threads', '?')} threads each; pairs are {first} / {label}.")
    else:
        title = (f"### Serving `{name}`: `{first}` against `{label}` (`fp8serve bench "
                 f"serve`, {size})")
        note = f"Both on {_model_label(other.get('model'))}; pairs are `{first}` / `{label}`."
    return [title, ""] + _table(head, rows) + ["", note]


# two-server `bench serve` runs (servers_section): --llama-server, --compare-server-arg
SERVER_PAIRS = ("llama-serve-*.json", "flags-serve-*.json", "prediction-serve-*.json")


def server_pair_files(results: Path) -> list[tuple[Path, str]]:
    """(file, the name its section shows) of each two-server run in ``results``."""
    return [(p, p.stem.split("-serve-", 1)[1])
            for pattern in SERVER_PAIRS for p in sorted(results.glob(pattern))]


def rss_section(runs: list[dict[str, Any]]) -> list[str]:
    head = ["model", "weights (GiB)", "KV budget (GiB)", "peak RSS (GiB)",
            "over weights + KV (GiB)", "anon / file-backed (GiB)", "python+torch alone (GiB)"]
    rows = [[r["model"], f"{r['weight_bytes']['text_decoder'] / GIB:.2f}",
             f"{r['kv_cache_bytes'] / GIB:.2f}", f"{r['peak_rss_gib']:.2f}",
             f"{r['overhead_gib']:+.2f}",
             f"{r['memory']['after_requests'].get('RssAnon', 0) / GIB:.2f} / "
             f"{r['memory']['after_requests'].get('RssFile', 0) / GIB:.2f}",
             f"{r['interpreter_baseline'].get('VmHWM', 0) / GIB:.2f}"] for r in runs]
    return (["### Server peak RSS (`fp8serve bench rss`: VmHWM after a few requests)", ""]
            + _table(head, rows))


def structured_spec_section(s: dict[str, Any], name: str) -> list[str]:
    """``bench structured --speculative-config``: speculative against plain constrained
    decoding per workload (median of the interleaved rounds' ratios)."""
    c = s["config"]
    head = ["workload", "concurrency", "plain tok/s", "speculative tok/s", "x plain",
            "each round", "tokens per step", "acceptance", "forced tokens",
            "mask fill / plain step", "outputs identical"]
    rows = [[r["workload"], str(r["concurrency"]), _f(r["plain_decode_tok_s"]),
             _f(r["spec_decode_tok_s"]), _f(r["speedup"], "{:.2f}"),
             ", ".join(f"{x:.2f}" for x in r["round_speedups"]),
             _f(r["tokens_per_step"]["on"], "{:.2f}"),
             _f(r["spec"]["acceptance_rate"], "{:.2f}"), str(r["spec"]["num_forced_tokens"]),
             f"{r['fill_per_step'] * 100:.2f}%", "yes" if r["outputs_identical"] else "NO"]
            for r in s["rows"]]
    oracle = f", drafts from --spec-oracle {c['oracle']}" if c.get("oracle") else ""
    return ([f"### Speculative decoding under a grammar, `{name}` (`fp8serve bench "
             f"structured --speculative-config`, {c['spec']['method']} "
             f"k={c['spec']['num_speculative_tokens']}, {c['gen_len']} tokens, "
             f"{c['rounds']} interleaved round{'s' if c['rounds'] > 1 else ''}{oracle})", ""]
            + _table(head, rows))


def spec_section(s: dict[str, Any], name: str) -> list[str]:
    """``bench generate --speculative-config`` / ``--prediction``: decoding with drafts
    against plain decoding per workload and concurrency (medians of interleaved rounds)."""
    c = s["config"]
    what = []
    if c.get("spec"):
        what.append(f"`--speculative-config` {c['spec']['method']} "
                    f"k={c['spec']['num_speculative_tokens']}")
    if c.get("prediction"):
        what.append(f"`--prediction {c['prediction']}`")
    if c.get("oracle"):
        what.append(f"drafts from `--spec-oracle {c['oracle']}`")
    head = ["workload", "concurrency", "plain tok/s", "with drafts tok/s", "x plain",
            "each round", "tokens per sequence step", "acceptance", "outputs identical"]
    rows = []
    for r in s["rows"]:
        rounds = [on["decode_tok_s"] / off["decode_tok_s"]
                  for off, on in zip(r["passes"]["off"], r["passes"]["on"], strict=True)
                  if on["decode_tok_s"] and off["decode_tok_s"]]
        rows.append([r["workload"], str(r["concurrency"]), _f(r["plain_decode_tok_s"]),
                     _f(r["spec_decode_tok_s"]), _f(r["speedup"], "{:.2f}"),
                     ", ".join(f"{x:.2f}" for x in rounds),
                     _f(r["tokens_per_seq_step"], "{:.2f}"),
                     _f((r["spec"] or {}).get("acceptance_rate"), "{:.2f}"),
                     "yes" if r["outputs_identical"] else "NO"])
    return ([f"### Drafts, `{name}` (`fp8serve bench generate`, {' + '.join(what)}, "
             f"{c['gen_len']} tokens, {c['rounds']} interleaved "
             f"round{'s' if c['rounds'] > 1 else ''})", ""] + _table(head, rows))


def kernel_section(k: dict[str, Any]) -> list[str]:
    """Fastest FP8 kernel per (shape, M) against torch bf16 and the bandwidth bound."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in k["rows"]:
        key = (r["shape"], r["m"])
        if r["role"] != "baseline" and (key not in best
                                        or r["time_ms"] < best[key]["time_ms"]):
            best[key] = r
    head = ["shape (N x K)", "M", "fastest FP8 kernel", "ms", "x torch bf16", "% of bw bound"]
    rows = [[f"{r['shape']} ({r['n']} x {r['k']})", str(r["m"]), r["kernel"],
             f"{r['time_ms']:.3f}", _f(r.get("vs_bf16"), "{:.2f}"),
             f"{r['pct_of_bound']:.0f}"] for _, r in sorted(best.items())]
    return ([f"### Kernels (`fp8serve bench kernels`, read bandwidth "
             f"{k['read_bandwidth_gbps']:.1f} GB/s)", ""] + _table(head, rows)
            + ["", KERNEL_BOUND_NOTE])


KERNEL_BOUND_NOTE = ("% of bw bound = the time to read the FP8 weight at the read bandwidth "
                     "above, over the call's time (the weights rotate through copies that "
                     "exceed twice the last-level cache); above 100, the call read faster "
                     "than the probe did: the probe ran at another moment of a shared host, "
                     "or part of the weights stayed in a large cache.")


def _load(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(paths)]


def build_markdown(results: Path, command: str = "bench/run_all.sh") -> str:
    lines = [f"Measured with `{command}` on a shared machine; absolute figures vary with "
             "load, so compare the ratios (each measured in the same run).", ""]
    if (results / "kernels.json").is_file():
        lines += kernel_section(json.loads((results / "kernels.json").read_text())) + [""]
    gen = _load(list(results.glob("generate-*.json")))
    if gen:
        lines += generate_section(gen) + [""]
    for p in sorted(results.glob("serve-*.json")):
        lines += serve_section(json.loads(p.read_text()), p.stem.removeprefix("serve-")) + [""]
    for p, name in server_pair_files(results):
        lines += servers_section(json.loads(p.read_text()), name) + [""]
    for p in sorted(results.glob("spec-*.json")):
        lines += spec_section(json.loads(p.read_text()), p.stem.removeprefix("spec-")) + [""]
    for p in sorted(results.glob("structured-spec-*.json")):
        lines += structured_spec_section(json.loads(p.read_text()),
                                         p.stem.removeprefix("structured-spec-")) + [""]
    rss = _load(list(results.glob("rss-*.json")))
    if rss:
        lines += rss_section(rss) + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(build_markdown(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results")))
