"""The ``FP8SERVE_*`` variables read outside service.settings.Settings (whose fields are
each a variable too): where each is read and what it does. tests/docs/test_configuration_doc
greps engine/, service/, ext/ and cli/ and fails on a variable in neither place."""

from __future__ import annotations

# (name, where it is read, meaning)
ENV_VARS: tuple[tuple[str, str, str], ...] = (
    ("FP8SERVE_CACHE_DIR", "engine/demo_model, ext/build.py",
     "cache root (default `$XDG_CACHE_HOME/fp8serve`, else `~/.cache/fp8serve`): the "
     "converted demo model lives in "
     "`demo-smollm2-135m-fp8/`, the extension build in `ext/`"),
    ("FP8SERVE_EXT_DIR", "ext/build.py",
     "build directory of the C++ extension (default "
     "`$FP8SERVE_CACHE_DIR/ext/<torch>-<source hash>`)"),
    ("FP8SERVE_EXT_CFLAGS", "ext/build.py",
     "extra compiler flags for the extension (a separate build, cached by its flags). The "
     "AMX tile GEMM's knobs, for timing on an AMX host (no value changes a result bit): "
     "`-DFP8S_AMX_KC=256` (k per unpacked chunk), `-DFP8S_AMX_XBLOCK=1572864` (bytes of x "
     "per row block), `-DFP8S_AMX_DECODE=0` (decode rows through the row-tile walk), "
     "`-DFP8S_AMX_DECODE_ROWS=0` (decode tiles of 16 rows, x padded), `-DFP8S_AMX_PF=2048` "
     "(the decode walk's L1 prefetch distance, bytes), `-DFP8S_AMX_PF2=16384` (its L2 "
     "prefetch distance; 0 = none), `-DFP8S_AMX_DECODE_NT=1` (the decode walk one weight "
     "tile at a time instead of two side by side). For the "
     "fused decode team (the threads that run one fused decoder layer together, "
     "ext/csrc/decode_team.cpp): `-DFP8S_TEAM_SPLIT=0` (one shared range per phase, odd threads "
     "claiming from its back, instead of a contiguous part per thread). A "
     "diagnostic build: `-DFP8S_TEAM_PROFILE=1` prints to stderr, every 256 fused decode "
     "calls, each team thread's microseconds per call in the norms, each GEMM, RoPE, "
     "attention, SiLU and the barrier waits (ext/csrc/team_profile.h)"),
    ("FP8SERVE_LOG_LEVEL", "cli/main.py",
     "`DEBUG`, `INFO` (default), `WARNING` or `ERROR`: the log level when `--log-level` "
     "is not given (every subcommand takes `--log-level`, before or after its name)"),
    ("FP8SERVE_ISA", "ext/csrc/dispatch.cpp",
     "lower the extension's dispatch level: `scalar`, `avx2`, `avx512`, `avx512_vbmi`, "
     "`amx`; the kernel tables then choose as on such a host (`FP8SERVE_ISA=avx2` on an "
     "AVX-512 machine runs the AVX2 kernels). A level above the host's is ignored with a "
     "warning; any other value stops `serve`, `generate` and `kernels` at startup"),
    ("FP8SERVE_VISION_GEMM", "engine/vision/gemm.py",
     "`bf16` or `fp32`: force the vision tower's GEMM path instead of timing both at "
     "startup; any other value stops the vision tower's load, naming the two"),
    ("FP8SERVE_FUSED", "engine/runner.py",
     "`0` runs every decoder layer through the Python reference path (torch ops, SDPA) "
     "instead of the fused C++ layer: an escape hatch (GET /kernels `decoder_layers` and "
     "`fp8serve_decoder_layers` name it as the reason); `fp8serve bench generate`'s "
     "`python_layers` baseline times that path beside the fused one"),
)
