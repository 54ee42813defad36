// Plain-pointer elementwise kernels of the fused decoder layer (decode_layer.cpp,
// decode_team.cpp), in the ISA translation units decode_layer_avx512.cpp and
// decode_layer_avx2.cpp (no torch or STL headers). Rows are bf16 (raw uint16_t bits), math
// in fp32, results rounded to nearest even. Both sets have the same contract; their bits
// may differ (other reduction widths), so a process uses one set: row_ops(), by the
// dispatch ISA.
#pragma once

#include <cstdint>

#include "isa.h"

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

// The same four on AVX2 + FMA + F16C (8 lanes; a row's tail on a zero-padded copy).
namespace avx2 {
void rms_norm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out);
void rope_row(uint16_t* x, const float* cos, const float* sin, int64_t half);
void silu_mul_row(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out);
void add_row(uint16_t* h, const uint16_t* y, int64_t n);
}  // namespace avx2

struct RowOps {
  void (*rms_norm_row)(const uint16_t*, const uint16_t*, int64_t, float, uint16_t*);
  void (*rope_row)(uint16_t*, const float*, const float*, int64_t);
  void (*silu_mul_row)(const uint16_t*, const uint16_t*, int64_t, uint16_t*);
  void (*add_row)(uint16_t*, const uint16_t*, int64_t);
};

// The set of the dispatch ISA (cpu_isa(), fixed per process): AVX-512 from level avx512
// on, else AVX2. Callers check cpu_isa() >= Isa::kAvx2 first.
inline const RowOps& row_ops() {
  static const RowOps k512{avx512::rms_norm_row, avx512::rope_row, avx512::silu_mul_row,
                           avx512::add_row};
  static const RowOps k2{avx2::rms_norm_row, avx2::rope_row, avx2::silu_mul_row,
                         avx2::add_row};
  return cpu_isa() >= Isa::kAvx512 ? k512 : k2;
}
}  // namespace fp8serve
