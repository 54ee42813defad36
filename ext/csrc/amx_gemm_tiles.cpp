// The AMX FP8 W8A16 GEMM on the real tiles: amx_gemm.inc's walk with TDPBF16PS. Compiled
// for AVX-512 (VBMI) + AMX-TILE/AMX-BF16 only (ISA_BEGIN); called only when dispatch.cpp chose
// Isa::kAmx, which needs the OS grant of tile state (arch_prctl XTILEDATA). No torch or STL
// headers here.
//
// TDPBF16PS (Intel SDM): C.fp32[m][n] += sum over the 16 pairs of A.bf16[m][2k + i] *
// B.bf16[k][2n + i]; bf16 denormal inputs are treated as zero and fp32 denormal results
// flushed to zero, round to nearest even whatever MXCSR says; the order of the additions
// inside one instruction is not a sequential fp32 chain (measured: no AVX-512 arrangement
// reproduces its bits), which is why the stand-in (amx_gemm_standin.cpp) matches it only
// within a tolerance. The FP8 weight is unpacked to its exact bf16 value (e4m3 subnormals
// m * 2^-9 land as bf16 normals, so none is lost to the denormal rule) by the AVX-512
// VBMI table (fp8_cvt_vbmi.inc; Isa::kAmx implies VBMI), its tables held in registers by
// Tiles for the whole call, and the scale is applied on the fp32 sums.
#include <immintrin.h>

#include <cstdint>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,amx-tile,amx-bf16,fma")

namespace fp8serve {
namespace amx {
namespace {

#include "fp8_cvt_vbmi.inc"

struct alignas(64) TileConfig {  // palette 1 (the LDTILECFG memory format)
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

class Tiles {
 public:
  // rows: of the C tiles 0..3 and the A tile 4 (the decode walk's m); the others 16
  explicit Tiles(int rows = 16) {
    TileConfig cfg;
    __builtin_memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) {
      cfg.colsb[i] = 64;
      cfg.rows[i] = i <= 4 ? rows : 16;
    }
    // GCC 12's _tile_loadconfig asm names only the config's first 8 bytes as its input:
    // a compiler barrier keeps the colsb / rows stores from being dropped as dead
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
  }
  ~Tiles() { _tile_release(); }
  // tileloadd reads memory the compiler does not see (the intrinsic has no memory
  // operand): order the plain stores (padded x, folded sums) before the tile loads.
  void fence() const { __asm__ volatile("" ::: "memory"); }
  // exact bf16 of every code; dst 64-byte aligned (Grow), so no store splits a line
  void unpack(const uint8_t* w, int64_t pairs, uint16_t* dst) const {
    for (int64_t p = 0; p < pairs; ++p) {
      __m512i lo, hi;
      cvt_(w + 64 * p, lo, hi);
      _mm512_store_si512(dst + 64 * p, lo);
      _mm512_store_si512(dst + 64 * p + 32, hi);
    }
  }

 private:
  Cvt<true> cvt_;  // the tables in registers across the call's unpacks
};

#define TILE_ZERO(tl, t) _tile_zero(t)
#define TILE_LOAD(tl, t, p, stride) _tile_loadd(t, p, stride)
#define TILE_STORE(tl, t, p, stride) _tile_stored(t, p, stride)
#define TILE_DP(tl, c, a, b) _tile_dpbf16ps(c, a, b)
#include "amx_gemm.inc"

}  // namespace

void gemm_tiles(const GemvArgs& a, int64_t t0, int64_t t1) { gemm_tiles_impl(a, t0, t1); }

}  // namespace amx
}  // namespace fp8serve

ISA_END
