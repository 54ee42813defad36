// FP8 (e4m3) KV cache: the write that quantizes K/V per (token, KV head) and the row loader
// the portable paged-attention kernel reads them through (attention.h AttnArgs k8/v8).
//
//   kv_write_fp8: k, v [T, Hkv, D] bf16 (rows contiguous) -> k_cache / v_cache
//       [blocks, Hkv, block_size, D] float8_e4m3fn rows slot_mapping [T] int64 (attention.h
//       kv_row), k_scale / v_scale [blocks, Hkv, block_size] fp32:
//         s = static (> 0: a checkpoint's per-layer k_scale / v_scale) or
//             amax_i |x[t, h, i]| / 448 (1 when amax < 1e-30)
//         q[i] = e4m3_rne(clamp(x[t, h, i] / s, -448, 448)),  x ~= s * q
//       A token's stored bytes depend on that token's K/V alone: no block-wide scale, so
//       they are the same whichever tokens share its block, however the prompt was chunked.
//   load_kv_row: row (slot, h) -> fp32 [D] (bf16: the bits; fp8: exact bit arithmetic),
//       returning the row's dequant scale (1 for bf16).
// Quantization uses c10's float -> Float8_e4m3fn conversion, the one torch's .to() runs, so
// engine/model/kv_store.py's reference quantizer gives the same bytes.
#include <ATen/ATen.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention.h"
#include "ops.h"

namespace fp8serve {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kTinyAmax = 1e-30f;

// e4m3 code -> fp32, exact for every non-NaN code (the kernel never stores NaN: writes
// clamp to +-448): (c & 0x7F) << 20 as fp32 bits is |value| * 2^-120, subnormal codes
// included (they land as fp32 subnormals), and * 2^120 is exact. Integer ops and one
// multiply: the loop over a row vectorizes, unlike a table lookup.
inline float e4m3_to_f32(uint8_t c) {
  const uint32_t u = (uint32_t(c & 0x80u) << 24) | (uint32_t(c & 0x7Fu) << 20);
  float f;
  std::memcpy(&f, &u, 4);
  return f * 0x1p120f;
}

float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void check_fp8_cache(const at::Tensor& c, const at::Tensor& s, const char* op) {
  TORCH_CHECK(c.scalar_type() == at::kFloat8_e4m3fn && c.dim() == 4,
              op, ": caches must be float8_e4m3fn [blocks, Hkv, block_size, D], got ",
              c.scalar_type(), " ", c.sizes());
  check_kv_cache(c, op, c.size(0), c.size(1), c.size(2), c.size(3), &s);
}

}  // namespace

float quantize_kv_row(const uint16_t* x, int64_t d, float fixed, uint8_t* q) {
  float s = fixed;
  if (!(s > 0.0f)) {
    float amax = 0.0f;
    for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(bf16_bits_to_f32(x[i])));
    s = amax < kTinyAmax ? 1.0f : amax / kE4m3Max;
  }
  for (int64_t i = 0; i < d; ++i) {
    const float y = std::min(std::max(bf16_bits_to_f32(x[i]) / s, -kE4m3Max), kE4m3Max);
    q[i] = c10::Float8_e4m3fn(y).x;
  }
  return s;
}

float load_kv_row(const AttnArgs& a, bool value, int64_t slot, int64_t h, float* out) {
  const int64_t row = kv_row(slot, h, a.hkv, a.block_size);
  if (a.k8 == nullptr) {
    const uint16_t* r = (value ? a.v : a.k) + row * a.d;
    for (int64_t i = 0; i < a.d; ++i) out[i] = bf16_bits_to_f32(r[i]);
    return 1.0f;
  }
  const uint8_t* r = (value ? a.v8 : a.k8) + row * a.d;
  for (int64_t i = 0; i < a.d; ++i) out[i] = e4m3_to_f32(r[i]);
  return (value ? a.vs : a.ks)[row];
}

void attach_fp8_kv(AttnArgs& a, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& k_scale, const at::Tensor& v_scale) {
  check_fp8_cache(k_cache, k_scale, "paged_attention");
  check_fp8_cache(v_cache, v_scale, "paged_attention");
  a.k = a.v = nullptr;
  a.k8 = reinterpret_cast<const uint8_t*>(k_cache.data_ptr());
  a.v8 = reinterpret_cast<const uint8_t*>(v_cache.data_ptr());
  a.ks = k_scale.data_ptr<float>();
  a.vs = v_scale.data_ptr<float>();
}

void kv_write_fp8(const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& k_scale, const at::Tensor& v_scale, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& slot_mapping, double k_static,
                  double v_static) {
  check_fp8_cache(k_cache, k_scale, "kv_write_fp8");
  check_fp8_cache(v_cache, v_scale, "kv_write_fp8");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "kv_write_fp8: K/V caches differ in shape");
  const int64_t t_n = k.size(0), hkv = k_cache.size(1), bs = k_cache.size(2);
  const int64_t d = k_cache.size(3), slots = k_cache.size(0) * bs;
  for (const at::Tensor* x : {&k, &v}) {
    TORCH_CHECK(x->scalar_type() == at::kBFloat16 && x->dim() == 3 && x->size(0) == t_n &&
                    x->size(1) == hkv && x->size(2) == d && x->stride(2) == 1 &&
                    x->stride(1) == d,
                "kv_write_fp8: k/v must be bf16 [T, Hkv=", hkv, ", D=", d,
                "] with contiguous rows, got ", x->sizes());
  }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 &&
                  slot_mapping.size(0) == t_n && slot_mapping.is_contiguous(),
              "kv_write_fp8: slot_mapping must be contiguous int64 [T] = [", t_n, "]");
  const int64_t* sm = slot_mapping.data_ptr<int64_t>();
  auto* kc = reinterpret_cast<uint8_t*>(k_cache.data_ptr());
  auto* vc = reinterpret_cast<uint8_t*>(v_cache.data_ptr());
  float* ks = k_scale.data_ptr<float>();
  float* vs = v_scale.data_ptr<float>();
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr());
  for (int64_t t = 0; t < t_n; ++t) {
    TORCH_CHECK(sm[t] >= 0 && sm[t] < slots, "kv_write_fp8: slot ", sm[t], " outside [0, ",
                slots, ")");
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t row = kv_row(sm[t], h, hkv, bs);
      ks[row] = quantize_kv_row(kp + t * k.stride(0) + h * d, d, float(k_static), kc + row * d);
      vs[row] = quantize_kv_row(vp + t * v.stride(0) + h * d, d, float(v_static), vc + row * d);
    }
  }
}

}  // namespace fp8serve
