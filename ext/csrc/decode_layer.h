// Plain-pointer elementwise kernels of the fused decoder layer (decode_layer.cpp), in the
// AVX-512 translation unit decode_layer_avx512.cpp (no torch or STL headers). Rows are
// bf16 (raw uint16_t bits), math in fp32, results rounded to nearest even.
#pragma once

#include <cstdint>

namespace fp8serve {
namespace avx512 {
// out[i] = w[i] * bf16(x[i] * rsqrt(mean(x^2) + eps)), i < n
void rms_norm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out);
// Half-split rotation in place: x[i], x[i + half] <- (x1 c - x2 s, x2 c + x1 s)
void rope_row(uint16_t* x, const float* cos, const float* sin, int64_t half);
// out[i] = bf16(bf16(silu(gate[i])) * up[i]), i < n
void silu_mul_row(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out);
// h[i] = bf16(h[i] + y[i])
void add_row(uint16_t* h, const uint16_t* y, int64_t n);
}  // namespace avx512
}  // namespace fp8serve
