"""Prefill attention: the C++ paged-attention op against torch SDPA."""
