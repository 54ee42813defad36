"""`fp8serve bench vision`: image encode GFLOP/s, one-image TTFT, decode ITL during an encode."""
