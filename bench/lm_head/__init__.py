"""`fp8serve bench lm-head`: the FP8 lm_head against bf16 (KL, top-1, greedy agreement, decode
speed)."""
