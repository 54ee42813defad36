"""`fp8serve bench kernels` and `gpu-kernels`: each FP8 kernel against torch bf16 matmul and
the bandwidth bound."""
