"""`fp8serve bench generate --speculative-config`: speculative decoding against plain decode on
replayed workloads."""
