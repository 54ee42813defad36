// AVX-512 BF16 + VBMI variant of the GEMV and tile unpack (same vnni32 weight layout).
// Compiled for that ISA only; used when dispatch.cpp chose Isa::kAvx512Vbmi or higher on
// a host with AVX512_VBMI (Ice Lake and later Intel, AMD Zen 4/5).
//
// FP8 e4m3 -> BF16 by table, 64 codes per step, exact for all 256 codes:
//   c = the 64 bytes with their 8-byte groups reordered (vpermq) so that the in-lane
//       unpacklo/hi below emit words in the original byte order;
//   h = vpermt2b(HI, c) | (c & 0x80)   high byte of the bf16 (table indexed by the 7
//                                       magnitude bits, sign ORed in);
//   l = vpermt2b(LO, c)                low byte;
//   lo/hi words = unpacklo/hi_epi8(l, h).
// 6 shuffles + 1 ternlog per 64 weights against 12 ops for the shift-and-fix-up path;
// zero and subnormals come out as exact bf16 normals (dpbf16 flushes bf16 denormals).
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")

namespace fp8serve {
namespace avx512_vbmi {
namespace {

struct Tables {
  // [variant][code & 0x7F]: variant 0 exact, 1 scaled by 2^-8
  alignas(64) uint8_t hi[2][128];
  alignas(64) uint8_t lo[2][128];
};

Tables make_tables() {
  Tables t;
  for (int v = 0; v < 2; ++v) {
    for (int c = 0; c < 128; ++c) {
      uint16_t bits = fp8_to_bf16_scalar(static_cast<uint8_t>(c));
      const bool finite_nonzero = c != 0 && c != 0x7F;
      if (v == 1 && finite_nonzero) bits = static_cast<uint16_t>(bits - (8 << 7));
      t.hi[v][c] = static_cast<uint8_t>(bits >> 8);
      t.lo[v][c] = static_cast<uint8_t>(bits & 0xFF);
    }
  }
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

template <bool kExact>
struct Cvt {
  __m512i hi0, hi1, lo0, lo1, sign, qidx;

  Cvt() {  // explicit: GCC does not apply the target pragma to implicit constructors
    const Tables& t = tables();
    const int v = kExact ? 0 : 1;
    hi0 = _mm512_load_si512(t.hi[v]);
    hi1 = _mm512_load_si512(t.hi[v] + 64);
    lo0 = _mm512_load_si512(t.lo[v]);
    lo1 = _mm512_load_si512(t.lo[v] + 64);
    sign = _mm512_set1_epi8(static_cast<char>(0x80));
    qidx = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
  }

  inline void operator()(const uint8_t* p, __m512i& lo, __m512i& hi) const {
    const __m512i c = _mm512_permutexvar_epi64(qidx, _mm512_loadu_si512(p));
    __m512i h = _mm512_permutex2var_epi8(hi0, c, hi1);
    const __m512i l = _mm512_permutex2var_epi8(lo0, c, lo1);
    h = _mm512_ternarylogic_epi32(h, c, sign, 0xF8);  // h | (c & 0x80)
    lo = _mm512_unpacklo_epi8(l, h);
    hi = _mm512_unpackhi_epi8(l, h);
  }
};

#include "avx512_kernels.inc"

}  // namespace

void direct_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  direct_tiles_impl<Cvt<false>>(a, t0, t1);
}

void panel_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  panel_tiles_impl<Cvt<false>>(a, t0, t1);
}

void unpack_tile(const uint8_t* w, int64_t p0, int64_t p1, uint16_t* dst,
                 const float* block_scale, int64_t block_k) {
  unpack_tile_impl<Cvt<true>>(w, p0, p1, dst, block_scale, block_k);
}

}  // namespace avx512_vbmi
}  // namespace fp8serve

ISA_END
