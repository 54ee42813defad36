// FP8 W8A16 GEMM ops: y[M, N] bf16 = x[M, K] bf16 @ (w[N, K] fp8 * scale).T + bias[N].
//
// gemm_avx512 (the default path on AVX-512 hosts): batch-invariant (gemm.h). M <=
//   gemv_max_m -> the direct path (FP8 -> BF16 in registers per row group of <= 4, or
//   of 8 from M = 8 on);
//   larger M -> the panel path (a K-chunk of two 32-column tiles converted to BF16 once,
//   then 6-row micro-kernel calls over a block of <= 512 rows; avx512_kernels.inc). Both
//   run the same dpbf16 chains, so gemv_max_m only affects speed. Split over N tiles, never K.
// gemm_amx: our AMX tile kernel for every M (amx_gemm.inc): batch-invariant, one
//   TDPBF16PS walk over K per output whatever M. On the real tiles when the dispatch level
//   is amx; at any lower level (FP8SERVE_ISA, or a host without AMX) the same walk runs on
//   the portable stand-in of the tile operations (amx_gemm_standin.cpp), which the
//   registry never picks for serving (the amx kernels need granted AMX) but the tests run
//   on every host.
// gemm_avx2: 16-column tiles, FP8 -> FP16 -> FP32 and FMA (fp8_gemm_avx2.cpp); block scales
//   applied to x per column block and k-block before it (ops.h).
// gemm_portable: gemm_avx2's layout on any host (fp8_gemm_portable.cpp): fp32 multiply-
//   then-add chains, block scales folded per k-block; batch-invariant, baseline ISA.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "gemm.h"
#include "isa.h"
#include "ops.h"
#include "tile_sched.h"

namespace fp8serve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Problem {
  at::Tensor x;  // [M, Kp] bf16 contiguous, zero beyond K
  at::Tensor y;  // [M, N] bf16
  GemvArgs a;
};

void check_scale(const char* op, const at::Tensor& scale, int64_t n, int64_t k, int64_t bn,
                 int64_t bk) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), op,
              ": scale must be contiguous float32, got ", scale.scalar_type());
  if (bk == 0) {
    TORCH_CHECK(scale.dim() == 1 && scale.size(0) == n, op,
                ": per-channel scale must be [N] = [", n, "], got ", scale.sizes());
    return;
  }
  TORCH_CHECK(bn > 0 && bn % kTileN == 0 && bk % kPadK == 0, op,
              ": block size (", bn, ", ", bk, ") must be multiples of (32, 32)");
  TORCH_CHECK(scale.dim() == 2 && scale.size(0) == ceil_div(n, bn) &&
                  scale.size(1) == ceil_div(k, bk),
              op, ": block scale must be [ceil(N/bn), ceil(K/bk)] = [", ceil_div(n, bn), ", ",
              ceil_div(k, bk), "], got ", scale.sizes());
}

Problem make_problem(const char* op, const at::Tensor& x, const at::Tensor& w,
                     const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                     int64_t n, int64_t bn, int64_t bk, bool needs_avx512 = true) {
  TORCH_CHECK(!needs_avx512 || cpu_isa() >= Isa::kAvx512, op,
              ": needs AVX-512 F/BW/VL/BF16; dispatch ISA is ", isa_name(cpu_isa()));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.device().is_cpu(), op,
              ": x must be a 2-D [M, K] bfloat16 CPU tensor, got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t m = x.size(0), k = x.size(1), kp = ceil_div(k, kPadK) * kPadK;
  // an empty reduction: the tile walks read their first K step before counting steps
  TORCH_CHECK(k > 0, op, ": K must be > 0, got x ", x.sizes());
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.is_contiguous() && w.dim() == 4 &&
                  w.size(0) == ceil_div(n, kTileN) && w.size(1) == kp / 2 &&
                  w.size(2) == kTileN && w.size(3) == 2,
              op, ": w_packed must be [N/32, K/2, 32, 2] = [", ceil_div(n, kTileN), ", ",
              kp / 2, ", 32, 2] fp8 (pack_vnni32 of w[N=", n, ", K=", k, "]), got ",
              w.scalar_type(), " ", w.sizes());
  check_scale(op, scale, n, k, bn, bk);
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->dim() == 1 && bias->size(0) == n,
                op, ": bias must be contiguous float32 [N] = [", n, "], got ", bias->sizes());
  }
  Problem p;
  if (kp == k) {
    p.x = x.contiguous();
  } else {
    p.x = at::zeros({m, kp}, x.options());
    p.x.narrow(1, 0, k).copy_(x);
  }
  p.y = at::empty({m, n}, x.options());
  p.a = GemvArgs{reinterpret_cast<const uint16_t*>(p.x.data_ptr()), kp, m,
                 reinterpret_cast<const uint8_t*>(w.data_ptr()), kp, n, scale.data_ptr<float>(),
                 bn, bk, bk ? ceil_div(k, bk) : 0, bias ? bias->data_ptr<float>() : nullptr,
                 reinterpret_cast<uint16_t*>(p.y.data_ptr())};
  return p;
}

}  // namespace

void fp8_linear_tiles(const GemvArgs& a, int64_t t0, int64_t t1, int64_t direct_max_m) {
  TORCH_CHECK(cpu_isa() >= Isa::kAvx512, "fp8_linear: needs AVX-512 BF16; dispatch ISA is ",
              isa_name(cpu_isa()));
  const bool direct = a.m <= direct_max_m;
  if (use_vbmi()) {
    direct ? avx512_vbmi::direct_tiles(a, t0, t1) : avx512_vbmi::panel_tiles(a, t0, t1);
  } else {
    direct ? avx512::direct_tiles(a, t0, t1) : avx512::panel_tiles(a, t0, t1);
  }
}

void fp8_linear(const GemvArgs& a, int64_t direct_max_m) {
  if (a.m == 0) return;
  // one row: single tiles stream as fast as groups (memory-bound); else tile pairs. On
  // the panel path a tile pair is long work (0.1-1 ms at 512 rows): one per claim.
  const int64_t step = a.m == 1 ? 1 : 2;
  const bool panel = a.m > direct_max_m;
  parallel_tiles(ceil_div(a.n, kTileN), step,
                 [&](int64_t t0, int64_t t1) { fp8_linear_tiles(a, t0, t1, direct_max_m); },
                 panel ? step : kMaxTileChunk);
}

at::Tensor gemm_avx512(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                       int64_t block_k, int64_t gemv_max_m) {
  Problem p = make_problem("gemm_avx512", x, w_packed, scale, bias, n, block_n, block_k);
  fp8_linear(p.a, gemv_max_m);
  return p.y;
}

void amx_linear_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  if (cpu_isa() >= Isa::kAmx) {
    amx::gemm_tiles(a, t0, t1);
  } else {
    amx_standin::gemm_tiles(a, t0, t1);
  }
}

void amx_linear(const GemvArgs& a) {
  if (a.m == 0) return;
  // decode rows stream the weight (many tiles per claim); a prefill tile is long work
  parallel_tiles(ceil_div(a.n, kTileN), 1,
                 [&](int64_t t0, int64_t t1) { amx_linear_tiles(a, t0, t1); },
                 a.m <= kAmxRowTile ? kMaxTileChunk : 1);
}

at::Tensor gemm_amx(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                    const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                    int64_t block_k) {
  Problem p = make_problem("gemm_amx", x, w_packed, scale, bias, n, block_n, block_k, false);
  amx_linear(p.a);
  return p.y;
}

namespace {

// The checks of the ops on the avx2_16 FP8 weight (gemm_avx2, gemm_portable).
void check_avx2_16(const char* op, const at::Tensor& x, const at::Tensor& w_packed,
                   const at::Tensor& scale, const std::optional<at::Tensor>& bias, int64_t n,
                   int64_t block_n, int64_t block_k) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.device().is_cpu(), op,
              ": x must be a 2-D [M, K] bfloat16 CPU tensor, got ", x.sizes());
  const int64_t k = x.size(1);
  TORCH_CHECK(w_packed.scalar_type() == at::kFloat8_e4m3fn && w_packed.is_contiguous() &&
                  w_packed.dim() == 3 && w_packed.size(0) == ceil_div(n, kTileN2) &&
                  w_packed.size(1) == k && w_packed.size(2) == kTileN2,
              op, ": w_packed must be [N/16, K, 16] = [", ceil_div(n, kTileN2), ", ", k,
              ", 16] fp8 (pack_avx2), got ", w_packed.sizes());
  check_scale(op, scale, n, k, block_n, block_k);
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                        bias->dim() == 1 && bias->size(0) == n),
              op, ": bias must be contiguous float32 [N] = [", n, "]");
}

}  // namespace

at::Tensor gemm_portable(const at::Tensor& x, const at::Tensor& w_packed,
                         const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                         int64_t n, int64_t block_n, int64_t block_k) {
  check_avx2_16("gemm_portable", x, w_packed, scale, bias, n, block_n, block_k);
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* xs = xf.data_ptr<float>();
  const auto* w = reinterpret_cast<const uint8_t*>(w_packed.data_ptr());
  const float* s = scale.data_ptr<float>();
  const float* bs = bias ? bias->data_ptr<float>() : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  parallel_tiles(ceil_div(n, kTileN2), 2, [&](int64_t t0, int64_t t1) {
    portable::gemm_tiles(xs, m, k, w, n, s, block_n, block_k, bs, yp, t0, t1);
  });
  return y;
}

at::Tensor gemm_avx2(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                     int64_t block_k) {
  TORCH_CHECK(cpu_isa() >= Isa::kAvx2, "gemm_avx2: needs AVX2/FMA/F16C; dispatch ISA is ",
              isa_name(cpu_isa()));
  check_avx2_16("gemm_avx2", x, w_packed, scale, bias, n, block_n, block_k);
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  at::Tensor xf = x.to(at::kFloat).contiguous();  // x is bf16: always a fresh copy
  const auto* w = reinterpret_cast<const uint8_t*>(w_packed.data_ptr());
  const float* bs = bias ? bias->data_ptr<float>() : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  if (block_k == 0) {
    const bool prescaled = avx2::prescale_x(xf.data_ptr<float>(), m * k);
    const float* xs = xf.data_ptr<float>();
    const float* s = scale.data_ptr<float>();
    at::parallel_for(0, ceil_div(n, kTileN2), 1, [&](int64_t t0, int64_t t1) {
      avx2::gemm_tiles(xs, m, k, w, n, s, bs, yp, t0, t1, prescaled);
    });
    return y;
  }
  // Block scales: y[:, block c] = (x * s[c, k / block_k]) @ w[block c].T, each row of the
  // scaled x a function of that row alone (so the GEMM stays batch-invariant), in chunks
  // of rows that keep the scaled copy cache-sized; no per-column scale then.
  const float* xfp = xf.data_ptr<float>();
  const float* sp = scale.data_ptr<float>();
  const int64_t tiles_per = block_n / kTileN2, tiles = ceil_div(n, kTileN2);
  // (K = 0, an empty reduction, gives y = bias as without block scales: no chunk divide)
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 20) / (4 * std::max<int64_t>(k, 1)));
  at::parallel_for(0, ceil_div(n, block_n), 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> xs(size_t(std::min(m, chunk) * k));
    const int64_t t0 = c0 * tiles_per, t1 = std::min(tiles, c1 * tiles_per);
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
      avx2::gemm_tiles_block(xfp + r0 * k, std::min(chunk, m - r0), k, w, n, sp, block_n,
                             block_k, bs, yp + r0 * n, t0, t1, xs.data());
    }
  });
  return y;
}

}  // namespace fp8serve
