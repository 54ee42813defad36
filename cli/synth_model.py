"""`fp8serve synth-model`: write a random-weight checkpoint in a published Ministral-3
layout and shape (see engine/synth/checkpoint.py), with Ministral-3's tokenizer files
(engine/synth/tokenizer.py) for every shape."""

from __future__ import annotations

import argparse
from pathlib import Path

SHAPES = ("tiny", "smollm2-135m", "ministral-3-3b", "ministral-3-8b")
LAYOUTS = ("hf-multimodal", "hf-text", "native")
QUANTS = ("fp8-per-tensor", "fp8-block", "bf16")
TOKENIZERS = ("tekken", "hf", "both", "none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth-model", help="write a random-weight Ministral-3 checkpoint")
    p.add_argument("--shape", choices=SHAPES, required=True)
    p.add_argument("--out", type=Path, required=True,
                   help="output directory, new or empty (an existing checkpoint or other "
                        "files there are never overwritten: the command refuses)")
    p.add_argument("--layers", type=_positive, default=None,
                   help="override the number of layers")
    p.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="default: hf-multimodal for the Ministral-3 shapes, hf-text for tiny "
                        "and smollm2-135m (the demo model's shapes)")
    p.add_argument("--quant", choices=QUANTS, default="fp8-per-tensor")
    p.add_argument("--tied", choices=("yes", "no"), default=None, help="override tied embeddings")
    p.add_argument("--shard-mb", type=_positive, default=None,
                   help="max shard size (HF layouts)")
    p.add_argument("--original-max-pos", type=_positive, default=None,
                   help="rope original_max_position_embeddings")
    p.add_argument("--tokenizer", choices=TOKENIZERS, default="tekken",
                   help="tokenizer files: tekken (default) = a v13 tekken.json, encoded through "
                        "mistral-common; hf = tokenizer.json + chat_template.jinja; both; none")
    p.add_argument("--no-tokenizer", action="store_true", help="same as --tokenizer none")
    p.add_argument("--native-vision", action="store_true",
                   help="--layout native: also write the vision encoder (params.json "
                        "vision_encoder, vision_encoder.* tensors; hf-multimodal always has one)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    """argparse type: an integer >= 1 (a size, a count)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _check_out(out: Path) -> None:
    """--out must be new or an empty directory: writing into another checkpoint would
    leave its files beside the new ones (a native layout written over a Hugging Face one
    is still read as the old Hugging Face checkpoint)."""
    from cli.main import CliError

    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise CliError(f"--out {out}: exists and is not a directory")
    if any(out.iterdir()):
        raise CliError(f"--out {out}: exists and is not empty; synth-model writes only into "
                       "a new or empty directory (remove it, or choose another)")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    o: dict[str, object] = {"quant": args.quant, "seed": args.seed,
                            "tokenizer": "none" if args.no_tokenizer else args.tokenizer}
    if args.layers is not None:
        o["num_layers"] = args.layers
    if getattr(args, "native_vision", False):
        o["native_vision"] = True
    if args.layout is not None:
        o["layout"] = args.layout
    if args.tied is not None:
        o["tie_word_embeddings"] = args.tied == "yes"
    if args.shard_mb is not None:
        o["shard_bytes"] = args.shard_mb << 20
    if args.original_max_pos is not None:
        o["original_max_position_embeddings"] = args.original_max_pos
    return o


def run(args: argparse.Namespace) -> int:
    from cli.main import CliError
    from engine.synth import SynthSpec, write_checkpoint

    if args.native_vision and (args.layout or "") != "native":
        raise CliError("--native-vision needs --layout native (hf-multimodal always writes "
                       "the vision encoder; hf-text has none)")
    if args.no_tokenizer and args.tokenizer not in ("tekken", "none"):
        raise CliError(f"--no-tokenizer contradicts --tokenizer {args.tokenizer}")
    _check_out(args.out)
    try:
        spec = SynthSpec.preset(args.shape, **_overrides(args))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        result = write_checkpoint(args.out, spec)
    except ValueError as exc:  # e.g. --tokenizer hf without transformers
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{args.out}: {exc}") from None
    for f in result.files:
        print(f"  {f:45s} {(result.out_dir / f).stat().st_size / 2**20:10.1f} MiB")
    print(f"wrote {args.shape} ({spec.layout}, {spec.quant}, {spec.num_layers} layers) to "
          f"{result.out_dir}: {result.nbytes / 2**30:.2f} GiB")
    return 0
