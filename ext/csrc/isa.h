// Plain-pointer interface between the generic translation units (which include torch
// headers and are compiled for the baseline ISA) and the per-ISA translation units
// (fp8_gemm_avx512.cpp, fp8_gemm_avx2.cpp), which include nothing but <immintrin.h> and
// this header and are compiled for their ISA only (see ISA_BEGIN below). Keeping torch
// and the STL out of the ISA files means no inline function of a shared header is ever
// emitted with AVX-512 instructions and picked by the linker for baseline code.
//
// FP8 is float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, 0x7F and
// 0xFF are NaN, no infinities). BF16 and FP16 are passed as raw uint16_t bits.
#pragma once

#include <cstddef>
#include <cstdint>

// Per-ISA compilation. torch.utils.cpp_extension.load applies one set of flags to every
// source, so each ISA file opens with ISA_BEGIN("avx512f,...") - the equivalent of
// compiling that file alone with -mavx512f ... - and closes with ISA_END. Only the ISA
// files use it; never -march=native.
#if defined(__clang__)
#define FP8S_PRAGMA(x) _Pragma(#x)
#define ISA_BEGIN(t) FP8S_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define ISA_END FP8S_PRAGMA(clang attribute pop)
#elif defined(__GNUC__)
#define FP8S_PRAGMA(x) _Pragma(#x)
#define ISA_BEGIN(t) FP8S_PRAGMA(GCC push_options) FP8S_PRAGMA(GCC target(t))
#define ISA_END FP8S_PRAGMA(GCC pop_options)
#endif

namespace fp8serve {

// Instruction-set levels, ordered. Chosen once per process in dispatch.cpp.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vbmi = 3, kAmx = 4 };

// Packed AVX-512/AMX weight ("vnni32"): w[N, K] fp8 -> [Np/32][Kp/2][32][2] fp8 with
// Np = ceil(N/32)*32, Kp = ceil(K/32)*32, zero padded. Byte (t, p, j, i) holds
// w[32t + j, 2p + i]. One 64-byte line holds a 32-column x 2-deep tile: its first 32 bytes
// widen to one zmm of 16 columns x 2 k (the dpbf16 operand), and a [kc/2][32][2] slice
// converted to bf16 is exactly brgemm's VNNI B operand with ld_b = 32.
constexpr int64_t kTileN = 32;
constexpr int64_t kPadK = 32;

// Packed AVX2 weight ("avx2_16"): w[N, K] fp8 (or bf16, pack_bf16_avx2) -> [Np/16][K][16],
// Np = ceil(N/16)*16, zero padded.
constexpr int64_t kTileN2 = 16;

// Arguments of the small-M (decode) GEMV path. All row-major.
struct GemvArgs {
  const uint16_t* x;      // [M, ldx] bf16, columns K..Kp-1 zero
  int64_t ldx;            // >= Kp
  int64_t m;
  const uint8_t* w;       // vnni32 [Np/32][Kp/2][32][2]
  int64_t kp;             // Kp
  int64_t n;              // true N (outputs >= N are not written)
  const float* scale;     // per-channel [N], or block [ceil(N/bn), ceil(K/bk)] if block_k > 0
  int64_t block_n;        // multiple of 32 when block_k > 0
  int64_t block_k;        // 0: per-channel; else multiple of 32
  int64_t k_blocks;       // ceil(K/bk) (row stride of the block scale)
  const float* bias;      // [N] or nullptr
  uint16_t* y;            // [M, ldy] bf16
  int64_t ldy = 0;        // output row stride; 0 means n
};

// Arguments of the BF16-weight linear (gemm.h bf16_linear). All row-major.
struct Bf16GemmArgs {
  const uint16_t* x;      // [M, ldx] bf16, columns K..Kp-1 zero
  int64_t ldx;            // >= Kp
  int64_t m;
  const uint16_t* w;      // bf16 vnni32 [Np/32][Kp/2][32][2] (pack_bf16_vnni32)
  int64_t kp;             // Kp
  int64_t n;              // true N (outputs >= N are not written)
  const float* bias;      // [N] or nullptr
  void* y;                // [M, ldy] bf16 (uint16_t bits) or fp32
  int64_t ldy;            // output row stride in elements; 0 means n
  bool y_fp32;            // fp32 output instead of bf16
};

namespace avx512 {
// src[n] fp8 -> dst[n] bf16, exact for every non-NaN code.
void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n);
// y[:, 32t : 32t+32] for tiles [t0, t1) of the vnni32 weight. Batch-invariant (gemm.h):
// direct_tiles converts FP8 -> BF16 in registers for every row group (small M);
// panel_tiles converts each K-chunk once and runs all rows over it (large M). Both give
// bitwise the same y.
void direct_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
void panel_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
// The same chains on a BF16 vnni32 weight (bf16_gemm_avx512.cpp).
void bf16_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1);
// y[r, j] = bf16(c[r, j] * (scale ? scale[j] : 1) * mult + (bias ? bias[j] : 0)) for
// r < rows, j < cols (<= 32); c is [rows][32] fp32.
void epilogue(const float* c, int64_t rows, const float* scale, float mult,
              const float* bias, uint16_t* y, int64_t ldy, int64_t cols);
// w: `lines` 64-byte lines -> XOR of their 64-bit words (read_probe_avx512.cpp).
uint64_t xor_lines(const uint64_t* w, int64_t lines);
}  // namespace avx512

// Same contracts as avx512::direct_tiles / panel_tiles, table-based FP8
// conversion (VBMI); bitwise the same results as the avx512 versions.
namespace avx512_vbmi {
void direct_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
void panel_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
}  // namespace avx512_vbmi

namespace avx2 {
void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n);
// y = x @ (w * scale).T + bias over 16-wide column tiles [t0, t1).
// x [M, K] fp32 (pre-widened), w avx2_16 [Np/16][K][16], scale [N] or null (1: block
// scales are applied to x first), bias [N] or null.
// x_prescaled: x holds x * 2^112 (prescale_x returned true), and the weights are widened
// to value * 2^-120 (Fp8TopLoader in fp8_gemm_avx2.cpp): one shuffle, shift and mask per 8
// codes, where the fp16 route also needs vcvtph2ps. Every product is the same real number
// either way, so the result is bitwise the same.
void gemm_tiles(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                const float* scale, const float* bias, uint16_t* y, int64_t t0, int64_t t1,
                bool x_prescaled);
// The same GEMM with block scales (scale [ceil(N/bn), ceil(K/bk)], bn a multiple of 32)
// over tiles [t0, t1): for each column block, xs = x with k-block b times scale[block, b]
// (one fp32 rounding per element, so each row's result depends on that row alone), then
// gemm_tiles on xs with no per-column scale. x (not prescaled) and xs are [M, K] fp32.
void gemm_tiles_block(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                      const float* scale, int64_t bn, int64_t bk, const float* bias,
                      uint16_t* y, int64_t t0, int64_t t1, float* xs);
// x[0 .. count) *= 2^112 and true when every |x| < 2^16 (the product then stays finite
// and exact); otherwise false and x untouched. NaN entries give false.
bool prescale_x(float* x, int64_t count);
// y = x @ w.T + bias over 16-wide column tiles [t0, t1) (bf16_gemm_avx2.cpp).
// x [M, K] fp32 (pre-widened), w bf16 avx2_16 [Np/16][K][16], bias [N] or null;
// y [M, N] fp32 (y_fp32) or bf16 bits. The same arithmetic per output as gemm_tiles.
void bf16_gemm_tiles(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                     const float* bias, void* y, bool y_fp32, int64_t t0, int64_t t1);
// w: `lines` 64-byte lines -> XOR of their 64-bit words (read_probe_avx2.cpp).
uint64_t xor_lines(const uint64_t* w, int64_t lines);
}  // namespace avx2

// The AMX FP8 GEMM (amx_gemm.inc): y[:, 32t : 32t+32] for weight tiles [t0, t1) of the
// vnni32 weight, the same GemvArgs contract as avx512::direct_tiles (scale per-channel [N]
// or block). Batch-invariant: every output runs the same TDPBF16PS steps over K for any
// M. amx:: runs the real tiles (cpu_isa() == kAmx only); amx_standin:: runs the same walk
// on a portable stand-in of the tile operations (any host; matches amx:: only within a
// tolerance, see amx_gemm_standin.cpp).
namespace amx {
void gemm_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
}  // namespace amx
namespace amx_standin {
void gemm_tiles(const GemvArgs& a, int64_t t0, int64_t t1);
}  // namespace amx_standin

// The portable GEMMs (fp8_gemm_portable.cpp; baseline ISA, every host): the avx2_16
// layouts, x [M, K] fp32 (widened bf16), one multiply-then-add fp32 chain per output over
// k in order, so batch-invariant. gemm_tiles: w FP8, scale per-channel [N] (bk == 0) or
// block [ceil(N/bn), ceil(K/bk)] (bn a multiple of 16), bias [N] or null, y bf16 [M, N].
// bf16_gemm_tiles: w bf16, no scale, y [M, N] fp32 (y_fp32) or bf16 bits.
namespace portable {
void gemm_tiles(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                const float* scale, int64_t bn, int64_t bk, const float* bias, uint16_t* y,
                int64_t t0, int64_t t1);
void bf16_gemm_tiles(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                     const float* bias, void* y, bool y_fp32, int64_t t0, int64_t t1);
}  // namespace portable

// Portable, exact fp8 e4m3 -> bf16 bits (NaN codes -> bf16 NaN).
uint16_t fp8_to_bf16_scalar(uint8_t code);

// dispatch.cpp
Isa cpu_isa();             // chosen once: min(host ISA, FP8SERVE_ISA)
Isa host_isa();            // what the host supports (cpuid + OS state)
bool use_vbmi();           // cpu_isa() >= kAvx512Vbmi and the host has AVX512_VBMI
const char* isa_name(Isa isa);

}  // namespace fp8serve
