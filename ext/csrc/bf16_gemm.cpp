// BF16-weight linear (the lm_head): y[M, N] = x[M, K] bf16 @ w[N, K].T (+ bias), fp32
// accumulation, bf16 or fp32 output. Batch-invariant (gemm.h); split over column tiles.
//   gemm_bf16_avx512: the weight packed by pack_bf16_vnni32 ([Np/32][Kp/2][32][2] bf16),
//       32-column tiles (bf16_gemm_avx512.cpp).
//   gemm_bf16_avx2: the weight packed by pack_bf16_avx2 ([Np/16][K][16] bf16), 16-column
//       tiles of fp32 FMA (bf16_gemm_avx2.cpp, avx2_gemm.inc).
//   gemm_bf16_portable: the same packed weight, fp32 multiply-then-add chains on any host
//       (fp8_gemm_portable.cpp).
#include <ATen/Parallel.h>

#include "gemm.h"
#include "isa.h"
#include "ops.h"
#include "tile_sched.h"

namespace fp8serve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_args(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                int64_t n, int64_t kp) {
  const char* op = "gemm_bf16_avx512";
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.dim() == 4 &&
                  w.size(0) == ceil_div(n, kTileN) && w.size(1) == kp / 2 &&
                  w.size(2) == kTileN && w.size(3) == 2,
              op, ": w_packed must be [N/32, K/2, 32, 2] = [", ceil_div(n, kTileN), ", ",
              kp / 2, ", 32, 2] bf16 (pack_bf16_vnni32 of w[N=", n, ", K=", x.size(1),
              "]), got ", w.scalar_type(), " ", w.sizes());
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->dim() == 1 && bias->size(0) == n,
                op, ": bias must be contiguous float32 [N] = [", n, "], got ", bias->sizes());
  }
}

}  // namespace

void bf16_linear_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1) {
  TORCH_CHECK(cpu_isa() >= Isa::kAvx512, "bf16_linear: needs AVX-512 BF16; dispatch ISA is ",
              isa_name(cpu_isa()));
  avx512::bf16_tiles(a, t0, t1);
}

void bf16_linear(const Bf16GemmArgs& a) {
  if (a.m == 0) return;
  parallel_tiles(ceil_div(a.n, kTileN), 2,
                 [&](int64_t t0, int64_t t1) { bf16_linear_tiles(a, t0, t1); });
}

at::Tensor gemm_bf16_avx512(const at::Tensor& x, const at::Tensor& w_packed,
                            const std::optional<at::Tensor>& bias, int64_t n, bool out_fp32) {
  TORCH_CHECK(cpu_isa() >= Isa::kAvx512, "gemm_bf16_avx512: needs AVX-512 F/BW/VL/BF16; "
              "dispatch ISA is ", isa_name(cpu_isa()));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.device().is_cpu(),
              "gemm_bf16_avx512: x must be a 2-D [M, K] bfloat16 CPU tensor, got ",
              x.scalar_type(), " ", x.sizes());
  const int64_t m = x.size(0), k = x.size(1), kp = ceil_div(k, kPadK) * kPadK;
  check_args(x, w_packed, bias, n, kp);
  at::Tensor xp = x.contiguous();
  if (kp != k) {
    xp = at::zeros({m, kp}, x.options());
    xp.narrow(1, 0, k).copy_(x);
  }
  at::Tensor y = at::empty({m, n}, x.options().dtype(out_fp32 ? at::kFloat : at::kBFloat16));
  const Bf16GemmArgs a{reinterpret_cast<const uint16_t*>(xp.data_ptr()), kp, m,
                       reinterpret_cast<const uint16_t*>(w_packed.data_ptr()), kp, n,
                       bias ? bias->data_ptr<float>() : nullptr, y.data_ptr(), n, out_fp32};
  bf16_linear(a);
  return y;
}

namespace {

// The checks of the ops on the bf16 avx2_16 weight (gemm_bf16_avx2, gemm_bf16_portable).
void check_bf16_avx2_16(const char* op, const at::Tensor& x, const at::Tensor& w_packed,
                        const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.device().is_cpu(), op,
              ": x must be a 2-D [M, K] bfloat16 CPU tensor, got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t k = x.size(1);
  TORCH_CHECK(w_packed.scalar_type() == at::kBFloat16 && w_packed.is_contiguous() &&
                  w_packed.dim() == 3 && w_packed.size(0) == ceil_div(n, kTileN2) &&
                  w_packed.size(1) == k && w_packed.size(2) == kTileN2,
              op, ": w_packed must be [N/16, K, 16] = [", ceil_div(n, kTileN2), ", ", k,
              ", 16] bf16 (pack_bf16_avx2 of w[N=", n, ", K]), got ", w_packed.scalar_type(),
              " ", w_packed.sizes());
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->dim() == 1 && bias->size(0) == n,
                op, ": bias must be contiguous float32 [N] = [", n, "], got ", bias->sizes());
  }
}

}  // namespace

namespace {

// y = x @ w.T + bias on the bf16 avx2_16 weight through `tiles` (the AVX2 or the
// portable walk: the same signature), over column tiles split across the threads.
using Bf16Tiles = void (*)(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                           const float*, void*, bool, int64_t, int64_t);

at::Tensor run_bf16_avx2_16(const char* op, Bf16Tiles tiles, const at::Tensor& x,
                            const at::Tensor& w_packed, const std::optional<at::Tensor>& bias,
                            int64_t n, bool out_fp32) {
  check_bf16_avx2_16(op, x, w_packed, bias, n);
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options().dtype(out_fp32 ? at::kFloat : at::kBFloat16));
  if (m == 0) return y;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const float* xs = xf.data_ptr<float>();
  const auto* w = reinterpret_cast<const uint16_t*>(w_packed.data_ptr());
  const float* bs = bias ? bias->data_ptr<float>() : nullptr;
  void* yp = y.data_ptr();
  parallel_tiles(ceil_div(n, kTileN2), 2, [&](int64_t t0, int64_t t1) {
    tiles(xs, m, k, w, n, bs, yp, out_fp32, t0, t1);
  });
  return y;
}

}  // namespace

at::Tensor gemm_bf16_portable(const at::Tensor& x, const at::Tensor& w_packed,
                              const std::optional<at::Tensor>& bias, int64_t n,
                              bool out_fp32) {
  return run_bf16_avx2_16("gemm_bf16_portable", portable::bf16_gemm_tiles, x, w_packed, bias,
                          n, out_fp32);
}

at::Tensor gemm_bf16_avx2(const at::Tensor& x, const at::Tensor& w_packed,
                          const std::optional<at::Tensor>& bias, int64_t n, bool out_fp32) {
  TORCH_CHECK(cpu_isa() >= Isa::kAvx2, "gemm_bf16_avx2: needs AVX2/FMA/F16C; dispatch ISA is ",
              isa_name(cpu_isa()));
  return run_bf16_avx2_16("gemm_bf16_avx2", avx2::bf16_gemm_tiles, x, w_packed, bias, n,
                          out_fp32);
}

}  // namespace fp8serve
