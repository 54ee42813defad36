"""`fp8serve bench structured`: json_schema-constrained vs unconstrained decode tokens/s
through the engine at several concurrencies, interleaved in one process
(bench/structured/run.py). Prints ratios and the mask share; writes JSON.

With ``--speculative-config``: speculative against plain constrained decoding on three
workloads (extraction, tool-args, free-json; bench/structured/speculative.py), interleaved
in one process; prints ratios, acceptance and a mask fill's cost against a decode step."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("structured", help="constrained vs unconstrained decode tok/s")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--concurrency", default=None,
                   help="comma list of concurrencies (default 1,16; 1 with speculation)")
    p.add_argument("--gen-len", type=int, default=None,
                   help="tokens per request (default 48; at most 128 with speculation)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--speculative-config", default=None,
                   help="JSON (vLLM's keys, as serve takes it): measure speculative "
                        "decoding under grammars against plain constrained decoding")
    p.add_argument("--spec-oracle", choices=("right", "wrong"), default=None,
                   help="with --speculative-config: draft from the plain pass's output, "
                        "all kept or all rejected (random-weight checkpoints)")
    p.add_argument("--workloads", default=None,
                   help="with --speculative-config: comma list of extraction, tool-args, "
                        "free-json (default all)")
    p.add_argument("--json", type=Path, default=None,
                   help="results file (default bench/results/structured.json, or "
                        "structured-spec.json with speculation)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.structured.run import (
        StructuredBenchConfig,
        format_table,
        run_structured_bench,
    )

    if args.model is not None and not args.model.is_dir():
        raise BenchError(f"--model {args.model}: not a directory")
    spec = getattr(args, "speculative_config", None) is not None
    for flag, value in (("--workloads", getattr(args, "workloads", None)),
                        ("--spec-oracle", getattr(args, "spec_oracle", None))):
        if value is not None and not spec:
            raise BenchError(f"{flag} applies with --speculative-config only")
    # the configs' own floors (the speculative drafts need 2 tokens, the plain bench 4)
    require_at_least(args, 2 if spec else 4, "--gen-len")
    require_at_least(args, 1, "--rounds")
    conc = _concurrency(args.concurrency or ("1" if spec else "1,16"))
    if args.model is None:
        from engine.demo_model import ensure_demo_model
        args.model = ensure_demo_model()
    try:
        if spec:
            res, table = _speculative(args, conc)
        else:
            gen_len = 48 if args.gen_len is None else args.gen_len  # 0 is refused, not 48
            cfg = StructuredBenchConfig(args.model, conc, gen_len, args.rounds,
                                        args.threads)
            res = run_structured_bench(cfg, log=lambda s: print(s, flush=True))
            table = format_table(res)
    except ValueError as exc:  # engine.config.ConfigError is one too
        raise BenchError(str(exc)) from exc
    print(table)
    out = getattr(args, "json", None) or Path("bench/results/structured-spec.json" if spec
                            else "bench/results/structured.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


def _concurrency(given: str) -> tuple[int, ...]:
    """``--concurrency`` "1,16" -> (1, 16); a one-line error naming the flag otherwise."""
    try:
        conc = tuple(int(c) for c in given.split(",") if c.strip())
    except ValueError:
        raise BenchError(f"--concurrency {given}: not a comma-separated list of integers"
                         ) from None
    if not conc or min(conc) < 1:
        raise BenchError(f"--concurrency {given}: each level must be >= 1")
    return conc


def _speculative(args: argparse.Namespace, conc: tuple[int, ...]) -> tuple[dict, str]:
    from bench.structured.speculative import (
        WORKLOADS,
        StructuredSpecConfig,
        format_table,
        run_structured_spec_bench,
    )
    from engine.spec.config import SpeculativeConfig

    spec = SpeculativeConfig.parse(args.speculative_config)
    if spec is None:
        raise BenchError("--speculative-config: an empty config measures nothing")
    given = getattr(args, "workloads", None) or ",".join(WORKLOADS)
    names = tuple(w.strip() for w in given.split(",") if w.strip())
    cfg = StructuredSpecConfig(args.model, spec, names, conc,
                               128 if args.gen_len is None else args.gen_len,
                               args.rounds, args.threads, getattr(args, "spec_oracle", None))
    res = run_structured_spec_bench(cfg, log=lambda s: print(s, flush=True))
    return res, format_table(res)
