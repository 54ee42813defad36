"""`fp8serve bench generate`: single-stream prefill and decode tokens/s of fp8serve through
the model runner, against same-run baselines (bench/generate/run.py): the memory
bandwidth bound, torch bf16 matmul for the same FLOPs, transformers, llama.cpp and the same
runner on the Python layers (what the fused C++ op is worth). Prints a table of ratios and
writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.llamacpp.build import LIBRARY_CHOICES
from engine.config_flags import add_kv_cache_dtype_arg, add_lm_head_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="single-stream prefill/decode tokens/s vs baselines")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model, converted once)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for every engine (default: torch's default, all cores)")
    p.add_argument("--baselines", default="transformers,llamacpp,python_layers",
                   help="comma list of transformers, llamacpp, python_layers (the same "
                        "runner on the Python layers instead of the fused C++ op) "
                        "('' = none)")
    p.add_argument("--hf-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype transformers dequantizes the FP8 weights into")
    p.add_argument("--gguf", type=Path, default=None,
                   help="GGUF for llama.cpp (default: the demo model's original with the demo "
                        "model; any other checkpoint is exported to --gguf-types, cached "
                        "beside it as DIR.Q8_0.gguf / DIR.BF16.gguf)")
    p.add_argument("--gguf-types", default="Q8_0,BF16",
                   help="comma list of Q8_0, BF16: the exports llama.cpp is timed on")
    p.add_argument("--llamacpp-lib", choices=LIBRARY_CHOICES, default="auto",
                   help="llama.cpp library for the llamacpp baseline: native = this host's "
                        "build (`fp8serve bench llamacpp`, built first if missing), auto = "
                        "that build when it exists, installed = llama-cpp-python's own")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleaved timed rounds of fp8serve and each llama.cpp GGUF "
                        "(order reversed every other round), or with --speculative-config of "
                        "plain and speculative passes; figures are the median round's")
    p.add_argument("--against-disabled", default="", metavar="KERNELS",
                   help="comma list of kernel ids: also time the same checkpoint on a second "
                        "runner with these kernels disabled, in the same process and rounds "
                        "(e.g. amx_w8a16,amx_block_w8a16 on an AMX host: the AVX-512 path); "
                        "its row's ratios are the median of per-round ratios")
    p.add_argument("--bandwidth-mib", type=int, default=1024,
                   help="read-bandwidth probe buffer (MiB; the probe reads all of it per pass)")
    p.add_argument("--bandwidth-passes", type=int, default=5,
                   help="best of this many passes per bandwidth sample")
    add_lm_head_arg(p)
    add_kv_cache_dtype_arg(p)
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="compare plain decoding with this speculative config (vLLM's "
                        "JSON) on the grounded / code-edit / story chat workloads, through "
                        "the engine, interleaved; replaces the baseline comparison")
    p.add_argument("--prediction", choices=("text", "answer"), default=None,
                   help="compare plain decoding with decoding given each request's predicted "
                        "output (OpenAI's prediction; with --speculative-config as well, "
                        "else alone): text = the passage or function the prompt quotes or "
                        "edits (what a client would send), answer = the plain pass's own "
                        "output (every prediction token right: the ceiling)")
    p.add_argument("--workloads", default=None,
                   help="with --speculative-config or --prediction: comma list of "
                        "workloads (default grounded,code-edit,story; grounded,code-edit "
                        "with --prediction text)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16],
                   help="with --speculative-config or --prediction: concurrent requests per "
                        "pass")
    p.add_argument("--spec-oracle", choices=("right", "wrong"), default=None,
                   help="with --speculative-config: draft from the plain pass's output, "
                        "every token right (the ceiling verify steps allow on this host and "
                        "model) or every token wrong (the floor the draft policy leaves); "
                        "for checkpoints whose text means nothing")
    p.add_argument("--json", type=Path, default=None,
                   help="default bench/results/generate.json (spec.json with "
                        "--speculative-config, prediction.json with --prediction alone)")
    p.set_defaults(func=run)


def _model_and_gguf(args: argparse.Namespace) -> tuple[Path, Path | None]:
    from engine.demo_model import default_demo_dir, ensure_demo_model, find_gguf

    if args.model is not None and not args.model.is_dir():
        raise BenchError(f"--model {args.model}: not a directory")
    demo = args.model is None or args.model.resolve() == default_demo_dir().resolve()
    model = ensure_demo_model() if args.model is None else args.model
    gguf = args.gguf
    if gguf is None and demo and "llamacpp" in args.baselines:
        try:
            gguf = find_gguf()
        except Exception:  # noqa: BLE001 - reported as a skip by the baseline
            gguf = None
    return model, gguf


def config_from_args(args: argparse.Namespace) -> Any:
    from bench.generate.run import GenerateBenchConfig

    for flag, value in (("--bandwidth-mib", args.bandwidth_mib),
                        ("--bandwidth-passes", getattr(args, "bandwidth_passes", 5))):
        if value < 1:
            raise BenchError(f"{flag} {value}: must be >= 1")
    model, gguf = _model_and_gguf(args)
    try:
        return GenerateBenchConfig(
            model_dir=model, prompt_len=args.prompt_len, gen_len=args.gen_len,
            threads=args.threads, hf_dtype=args.hf_dtype, gguf=gguf,
            baselines=tuple(b.strip() for b in args.baselines.split(",") if b.strip()),
            bandwidth_bytes=args.bandwidth_mib << 20,
            bandwidth_passes=getattr(args, "bandwidth_passes", 5),
            lm_head_dtype=getattr(args, "lm_head_dtype", None) or "auto",
            kv_cache_dtype=getattr(args, "kv_cache_dtype", None) or "auto",
            rounds=getattr(args, "rounds", 1),
            llamacpp_lib=getattr(args, "llamacpp_lib", "auto"),
            against_disabled=tuple(k.strip() for k in getattr(args, "against_disabled", "")
                                   .split(",") if k.strip()),
            gguf_types=tuple(t.strip() for t in getattr(args, "gguf_types", "Q8_0,BF16")
                             .split(",") if t.strip()))
    except ValueError as exc:
        raise BenchError(str(exc)) from exc


def _fmt(v: float | None, spec: str = "{:.1f}") -> str:
    return "-" if v is None else spec.format(v)


def _label(name: str, b: dict[str, Any]) -> str:
    if name == "transformers":
        return f"transformers ({b.get('dtype')})"
    if name == "python_layers":
        return "fp8serve, Python layers"
    if name == "kernels_off":
        return f"fp8serve, {','.join(b.get('disabled', []))} off"
    parts = Path(b.get("gguf") or "?").name.split(".")  # e.g. SmolLM2-135M.Q4_1.gguf
    return f"llama.cpp ({parts[-2] if len(parts) > 2 else 'GGUF'})"


def format_table(res: dict[str, Any]) -> str:
    """One row per engine; 'x' columns are fp8serve's figure divided by that row's."""
    ours, r = res["fp8serve"], res["ratios"]
    rows = [("fp8serve (FP8, runner)", ours["prefill_tok_s"], ours["decode_tok_s"], None, None),
            (f"bandwidth bound ({res.get('read_bandwidth_probe', 'read_xor')})", None,
             res["bandwidth_bound"]["decode_tok_s"], None, r["decode_vs_bandwidth_bound"]),
            ("bound, torch-sum probe", None, res["bandwidth_bound"]["torch_sum_decode_tok_s"],
             None, r["decode_vs_torch_sum_bound"]),
            ("torch bf16 matmul", res["bf16_matmul"]["prefill_tok_s"], None,
             r["prefill_vs_bf16_matmul"], None)]
    for name, b in res["baselines"].items():
        label = _label(name, b)
        if "skipped" in b:
            rows.append((f"{name}: skipped", None, None, None, None))
            continue
        rows.append((label, b["prefill_tok_s"], b["decode_tok_s"],
                     r[f"prefill_vs_{name}"], r[f"decode_vs_{name}"]))
    m, c = res["model"], res["config"]
    head = (f"{m['name']}: {m['num_layers']} layers, hidden {m['hidden_size']}; prompt "
            f"{c['prompt_len']}, gen {c['gen_len']}, {res['host']['torch_threads']} threads; "
            f"read bandwidth {res['read_bandwidth_gbps']:.1f} GB/s "
            f"({res.get('read_bandwidth_probe')}; torch sum "
            f"{res['torch_sum_bandwidth_gbps']:.1f} GB/s); "
            f"{res['bytes_per_token']['total'] / 2**20:.1f} MiB read per decode token")
    lines = [head, f"{'':<28}{'prefill tok/s':>14}{'decode tok/s':>14}"
             f"{'fp8serve x (pre)':>18}{'fp8serve x (dec)':>18}"]
    for label, pre, dec, xp, xd in rows:
        lines.append(f"{label:<28}{_fmt(pre):>14}{_fmt(dec):>14}"
                     f"{_fmt(xp, '{:.2f}'):>18}{_fmt(xd, '{:.2f}'):>18}")
    ext = ours.get("extension", {})
    samples = "; ".join(f"{s['label']} {_fmt(s['read_xor_gbps'])} / {s['torch_sum_gbps']:.1f}"
                        for s in res["read_bandwidth_samples"])
    lines.append(f"read bandwidth samples (read_xor / torch sum, GB/s): {samples}")
    lines.append(f"fp8serve kernels (layers): {ours['kernels']}{_generated(ours)}; lm_head: "
                 f"{ours.get('lm_head_kernel')}; fused C++ layers: {ours.get('fused_layers')}; "
                 f"extension built: "
                 f"{ext.get('built')}" + (f" ({ext['error']})" if ext.get("error") else ""))
    lines += [f"{_label(n, b)}: kernels (layers) {b['kernels']}{_generated(b)}; lm_head: "
              f"{b.get('lm_head_kernel')}; fused C++ layers: {b.get('fused_layers')}"
              for n, b in res["baselines"].items() if "kernels" in b]
    lines += _bytes_lines(res)
    lines += [f"{_label(n, b)}: {b['library']} ({b['system_info']})"
              for n, b in res["baselines"].items() if "system_info" in b]
    lines.append("(vs bandwidth bound: fraction of the bound reached; "
                 "vs bf16 matmul: fraction of torch's bf16 throughput for the same FLOPs)")
    return "\n".join(lines)


def _generated(runner: dict) -> str:
    """', generated rows: {...}' where some layers decode on another kernel (AMX hosts)."""
    gen = runner.get("generated_rows")
    return f", generated rows: {gen}" if gen else ""


def _bytes_lines(res: dict[str, Any]) -> list[str]:
    """Per engine: weight bytes read per decode token, the read rate that decode speed
    implies, and the per-round figures when there were several rounds."""
    ours = res["fp8serve"]
    rows = [("fp8serve", res["bytes_per_token"]["total"], ours)]
    rows += [(n, b["bytes_per_token"], b) for n, b in res["baselines"].items()
             if "bytes_per_token" in b]
    out = []
    for name, nb, t in rows:
        line = (f"{name}: {nb / 1e6:.0f} MB read per decode token -> "
                f"{nb * t['decode_tok_s'] / 1e9:.1f} GB/s at its decode speed")
        if len(t.get("rounds", {}).get("decode_tok_s", [])) > 1:
            line += "; rounds decode " + ", ".join(
                f"{x:.2f}" for x in t["rounds"]["decode_tok_s"]) + ", prefill " + ", ".join(
                f"{x:.1f}" for x in t["rounds"]["prefill_tok_s"])
        r = res["ratios"].get(f"{name}_per_round")
        if r:
            line += ("; fp8serve x per round decode " + ", ".join(f"{x:.2f}" for x in r["decode"])
                     + ", prefill " + ", ".join(f"{x:.2f}" for x in r["prefill"]))
        out.append(line)
    return out


def spec_config_from_args(args: argparse.Namespace) -> Any:
    from bench.spec.run import SpecBenchConfig
    from bench.spec.workloads import PREDICTIONS, WORKLOADS
    from engine.config import ConfigError
    from engine.demo_model import ensure_demo_model
    from engine.spec.config import SpeculativeConfig

    prediction = getattr(args, "prediction", None)
    try:
        spec = SpeculativeConfig.parse(args.speculative_config)
        if spec is None and prediction is None:
            raise BenchError("--speculative-config: give a config to compare with")
        if args.model is not None and not args.model.is_dir():
            raise BenchError(f"--model {args.model}: not a directory")
        workloads = args.workloads
        if workloads is None:
            workloads = ",".join(PREDICTIONS if prediction == "text" else WORKLOADS)
        return SpecBenchConfig(
            model_dir=ensure_demo_model() if args.model is None else args.model, spec=spec,
            workloads=tuple(w.strip() for w in workloads.split(",") if w.strip()),
            concurrency=tuple(args.concurrency), gen_len=args.gen_len, rounds=args.rounds,
            threads=args.threads, oracle=getattr(args, "spec_oracle", None),
            prediction=prediction)
    except (ConfigError, ValueError) as exc:
        raise BenchError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    log = lambda s: print(s, flush=True)  # noqa: E731
    spec = getattr(args, "speculative_config", None)
    if spec is not None or getattr(args, "prediction", None) is not None:
        from bench.spec.run import format_table as spec_table
        from bench.spec.run import run_spec_bench

        res = run_spec_bench(spec_config_from_args(args), log=log)
        table = spec_table(res)
        out = getattr(args, "json", None) or Path(
            "bench/results/" + ("spec.json" if spec is not None else "prediction.json"))
    else:
        from bench.generate.run import run_generate_bench

        res = run_generate_bench(config_from_args(args), log=log)
        table = format_table(res)
        out = getattr(args, "json", None) or Path("bench/results/generate.json")
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0
