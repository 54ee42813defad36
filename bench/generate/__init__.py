"""`fp8serve bench generate`: single-stream prefill and decode tokens/s against transformers,
llama.cpp and the bandwidth bound."""
