"""`fp8serve bench kv-cache`: the FP8 KV cache against bf16 (accuracy, decode speed, the
attention op)."""
