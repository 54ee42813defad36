// The AMX FP8 W8A16 GEMM's walk (amx_gemm.inc) on a portable stand-in of the tile
// operations, for every host: the blocking, row padding, K walk, tails and scales are the
// real kernel's, only the tile instructions are plain C++. Baseline ISA, no intrinsics.
//
// The stand-in TDPBF16PS follows the SDM pseudo-code: for each output, over the 16 pairs
// in order, c = fl(c + a[2k] * b[2k]) then c = fl(c + a[2k+1] * b[2k+1]) in fp32 (each
// bf16 x bf16 product is exact in fp32), bf16 denormal inputs read as zero and fp32
// denormal results flushed to zero. The hardware's internal order is not this chain, so
// the stand-in agrees with the real tiles within a tolerance, not bit for bit; what it
// does reproduce is every property of the walk (which rows, columns and k each output
// sees, in which order, from which start value).
#include <cstdint>
#include <cstring>

#include "isa.h"

namespace fp8serve {
namespace amx_standin {
namespace {

float bf16_in(uint16_t b) {  // DAZ: a bf16 denormal reads as (signed) zero
  if ((b & 0x7F80) == 0) b &= 0x8000;
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float ftz(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  std::memcpy(&f, &u, 4);
  return f;
}

class Tiles {
 public:
  // rows: of the C tiles 0..3 and the A tile 4, as amx_gemm_tiles.cpp configures them; a
  // load reads that many rows and zeroes the rest, a store writes that many, as the real
  // tiles do
  explicit Tiles(int rows = 16) {
    for (int i = 0; i < 8; ++i) rows_[i] = i <= 4 ? rows : 16;
  }
  void fence() const {}
  template <int T>
  void zero() {
    std::memset(t_[T], 0, sizeof(t_[T]));
  }
  template <int T>
  void load(const void* p, int64_t stride) {
    std::memset(t_[T], 0, sizeof(t_[T]));
    for (int r = 0; r < rows_[T]; ++r) {
      std::memcpy(t_[T][r], static_cast<const char*>(p) + r * stride, 64);
    }
  }
  template <int T>
  void store(void* p, int64_t stride) {
    for (int r = 0; r < rows_[T]; ++r) {
      std::memcpy(static_cast<char*>(p) + r * stride, t_[T][r], 64);
    }
  }
  template <int C, int A, int B>
  void dp() {
    for (int m = 0; m < rows_[C]; ++m) {
      for (int n = 0; n < 16; ++n) {
        float c = f32(C, m, n);
        for (int k = 0; k < 16; ++k) {
          c = ftz(c + bf16_in(u16(A, m, 2 * k)) * bf16_in(u16(B, k, 2 * n)));
          c = ftz(c + bf16_in(u16(A, m, 2 * k + 1)) * bf16_in(u16(B, k, 2 * n + 1)));
        }
        std::memcpy(t_[C][m] + 4 * n, &c, 4);
      }
    }
  }
  void unpack(const uint8_t* w, int64_t pairs, uint16_t* dst) const {
    for (int64_t i = 0; i < pairs * 64; ++i) dst[i] = fp8_to_bf16_scalar(w[i]);
  }

 private:
  float f32(int t, int r, int n) const {
    float f;
    std::memcpy(&f, t_[t][r] + 4 * n, 4);
    return f;
  }
  uint16_t u16(int t, int r, int i) const {
    uint16_t v;
    std::memcpy(&v, t_[t][r] + 2 * i, 2);
    return v;
  }
  alignas(64) unsigned char t_[8][16][64];
  int rows_[8];
};

#define TILE_ZERO(tl, t) (tl).zero<t>()
#define TILE_LOAD(tl, t, p, stride) (tl).load<t>(p, stride)
#define TILE_STORE(tl, t, p, stride) (tl).store<t>(p, stride)
#define TILE_DP(tl, c, a, b) (tl).dp<c, a, b>()
#include "amx_gemm.inc"

}  // namespace

void gemm_tiles(const GemvArgs& a, int64_t t0, int64_t t1) { gemm_tiles_impl(a, t0, t1); }

}  // namespace amx_standin
}  // namespace fp8serve
