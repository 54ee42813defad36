// Weight packing: canonical w[N, K] fp8 (or bf16 for pack_bf16_vnni32), row-major
// contiguous -> kernel tile layouts.
// Pure data movement; padding is zero (fp8 code 0x00 and bf16 0x0000 are +0.0).
#include <ATen/Parallel.h>

#include <cstring>

#include "isa.h"
#include "ops.h"

namespace fp8serve {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

void check_canonical(const at::Tensor& w, const char* op,
                     at::ScalarType dtype = at::kFloat8_e4m3fn) {
  TORCH_CHECK(w.scalar_type() == dtype, op, ": w must be ", dtype, " [N, K], got ",
              w.scalar_type());
  TORCH_CHECK(w.dim() == 2, op, ": w must be 2-D [N, K], got ", w.dim(), "-D");
  TORCH_CHECK(w.is_contiguous(), op,
              ": w must be row-major contiguous [N, K] (a transposed [K, N] view is "
              "rejected, never reinterpreted); strides ",
              w.strides());
  TORCH_CHECK(w.device().is_cpu(), op, ": w must be on CPU");
}

// w[N, K] -> [Np/32][Kp/2][32][2]: out[t][p][j][i] = w[32t + j][2p + i]
template <class T>
void pack_vnni32_into(const T* src, int64_t n, int64_t k, T* dst) {
  const int64_t np = round_up(n, kTileN), kp = round_up(k, kPadK);
  at::parallel_for(0, np / kTileN, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      T* tile = dst + t * (kp / 2) * kTileN * 2;
      for (int64_t j = 0; j < kTileN && t * kTileN + j < n; ++j) {
        const T* row = src + (t * kTileN + j) * k;
        for (int64_t c = 0; c < k; ++c) tile[(c / 2) * kTileN * 2 + j * 2 + (c & 1)] = row[c];
      }
    }
  });
}

}  // namespace

at::Tensor pack_vnni32(const at::Tensor& w) {
  check_canonical(w, "pack_vnni32");
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor out = at::zeros({round_up(n, kTileN) / kTileN, round_up(k, kPadK) / 2, kTileN, 2},
                             w.options());
  pack_vnni32_into(reinterpret_cast<const uint8_t*>(w.data_ptr()), n, k,
                   reinterpret_cast<uint8_t*>(out.data_ptr()));
  return out;
}

// bf16 w[N, K] -> bf16 [Np/32][Kp/2][32][2], the same element order as pack_vnni32
at::Tensor pack_bf16_vnni32(const at::Tensor& w) {
  check_canonical(w, "pack_bf16_vnni32", at::kBFloat16);
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor out = at::zeros({round_up(n, kTileN) / kTileN, round_up(k, kPadK) / 2, kTileN, 2},
                             w.options());
  pack_vnni32_into(reinterpret_cast<const uint16_t*>(w.data_ptr()), n, k,
                   reinterpret_cast<uint16_t*>(out.data_ptr()));
  return out;
}

// w[N, K] -> [Np/16][K][16]: out[t][c][j] = w[16t + j][c]
template <class T>
void pack_avx2_into(const T* src, int64_t n, int64_t k, T* dst) {
  const int64_t np = round_up(n, kTileN2);
  at::parallel_for(0, np / kTileN2, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      T* tile = dst + t * k * kTileN2;
      for (int64_t j = 0; j < kTileN2 && t * kTileN2 + j < n; ++j) {
        const T* row = src + (t * kTileN2 + j) * k;
        for (int64_t c = 0; c < k; ++c) tile[c * kTileN2 + j] = row[c];
      }
    }
  });
}

at::Tensor pack_avx2(const at::Tensor& w) {
  check_canonical(w, "pack_avx2");
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor out = at::zeros({round_up(n, kTileN2) / kTileN2, k, kTileN2}, w.options());
  pack_avx2_into(reinterpret_cast<const uint8_t*>(w.data_ptr()), n, k,
                 reinterpret_cast<uint8_t*>(out.data_ptr()));
  return out;
}

// bf16 w[N, K] -> bf16 [Np/16][K][16], pack_avx2's element order
at::Tensor pack_bf16_avx2(const at::Tensor& w) {
  check_canonical(w, "pack_bf16_avx2", at::kBFloat16);
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor out = at::zeros({round_up(n, kTileN2) / kTileN2, k, kTileN2}, w.options());
  pack_avx2_into(reinterpret_cast<const uint16_t*>(w.data_ptr()), n, k,
                 reinterpret_cast<uint16_t*>(out.data_ptr()));
  return out;
}

}  // namespace fp8serve
