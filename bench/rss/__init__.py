"""`fp8serve bench rss`: a server's peak resident memory against its weights and KV budget."""
