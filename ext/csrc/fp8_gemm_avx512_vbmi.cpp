// AVX-512 BF16 + VBMI variant of the GEMV (same vnni32 weight layout).
// Compiled for that ISA only; used when dispatch.cpp chose Isa::kAvx512Vbmi or higher on
// a host with AVX512_VBMI (Ice Lake and later Intel, AMD Zen 4/5).
//
// FP8 e4m3 -> BF16 by table: fp8_cvt_vbmi.inc.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")

namespace fp8serve {
namespace avx512_vbmi {
namespace {

#include "fp8_cvt_vbmi.inc"
#include "avx512_kernels.inc"

}  // namespace

void direct_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  direct_tiles_impl<Cvt<false>>(a, t0, t1);
}

void panel_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  panel_tiles_impl<Cvt<false>>(a, t0, t1);
}

}  // namespace avx512_vbmi
}  // namespace fp8serve

ISA_END
