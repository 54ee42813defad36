// AVX-512 loop of the read_xor probe (read_probe.cpp). Compiled for AVX-512F only; no
// torch or STL headers. w: lines x 64 bytes -> XOR of its 64-bit words; one zmm load per
// line, 4 independent accumulators.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f")

namespace fp8serve {
namespace avx512 {

uint64_t xor_lines(const uint64_t* w, int64_t lines) {
  const auto* p = reinterpret_cast<const __m512i*>(w);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 <= lines; i += 4) {
    a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(p + i + 1));
    a2 = _mm512_xor_si512(a2, _mm512_loadu_si512(p + i + 2));
    a3 = _mm512_xor_si512(a3, _mm512_loadu_si512(p + i + 3));
  }
  for (; i < lines; ++i) a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(p + i));
  const __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t out[8];
  _mm512_store_si512(reinterpret_cast<__m512i*>(out), a);
  return out[0] ^ out[1] ^ out[2] ^ out[3] ^ out[4] ^ out[5] ^ out[6] ^ out[7];
}

}  // namespace avx512
}  // namespace fp8serve

ISA_END
