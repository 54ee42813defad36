"""Benchmarks that report ratios against baselines measured in the same run."""
