"""KV-cache bookkeeping: the block allocator and the prefix cache."""
