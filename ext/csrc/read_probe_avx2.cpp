// AVX2 loop of the read_xor probe (read_probe.cpp). Compiled for AVX2 only; no torch or
// STL headers. w: lines x 64 bytes -> XOR of its 64-bit words; 4 independent 256-bit
// accumulators (two lines per iteration) keep several loads in flight.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx2")

namespace fp8serve {
namespace avx2 {

uint64_t xor_lines(const uint64_t* w, int64_t lines) {
  const auto* p = reinterpret_cast<const __m256i*>(w);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 2 <= lines; i += 2) {
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + 2 * i));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(p + 2 * i + 1));
    a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(p + 2 * i + 2));
    a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(p + 2 * i + 3));
  }
  if (i < lines) {
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + 2 * i));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(p + 2 * i + 1));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), a);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
