"""`fp8serve bench serve`: a running server under streaming load (TTFT, TPOT, ITL, throughput),
prefix-cache passes."""
