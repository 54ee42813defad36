"""Benchmarks that report ratios against baselines measured in the same run.

One folder per benchmark (kernels, generate, spec, serve, kv_cache, lm_head, structured,
vision, rss), each with its ``cli.py`` (the `fp8serve bench NAME` subcommand, gathered by
cli/bench.py); llamacpp/ builds the llama.cpp their baselines run; common/ holds what they
share, report/ turns bench/run_all.sh's JSON results into tables. bench imports engine and
service; neither imports bench (tests/test_import_layers.py)."""
