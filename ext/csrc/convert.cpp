// fp8_to_bf16 op: fp8[*] float8_e4m3fn -> bf16[*], exact for every non-NaN code.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "isa.h"
#include "ops.h"

namespace fp8serve {

uint16_t fp8_to_bf16_scalar(uint8_t code) {
  const uint16_t sign = static_cast<uint16_t>(code & 0x80) << 8;
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  if (e == 0xF && m == 0x7) return sign | 0x7FC0;  // NaN
  if (e != 0) return sign | static_cast<uint16_t>(((e + 120) << 7) | (m << 4));
  const float f = std::ldexp(static_cast<float>(m), -9);  // subnormal m * 2^-9, or 0
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return sign | static_cast<uint16_t>(u >> 16);  // exact: m has <= 3 significant bits
}

at::Tensor fp8_to_bf16(const at::Tensor& fp8) {
  TORCH_CHECK(fp8.scalar_type() == at::kFloat8_e4m3fn,
              "fp8_to_bf16: input must be float8_e4m3fn, got ", fp8.scalar_type());
  TORCH_CHECK(fp8.device().is_cpu(), "fp8_to_bf16: input must be on CPU");
  const at::Tensor src = fp8.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kBFloat16));
  const auto* s = reinterpret_cast<const uint8_t*>(src.data_ptr());
  auto* d = reinterpret_cast<uint16_t*>(out.data_ptr());
  const Isa isa = cpu_isa();
  constexpr int64_t kGrain = 1 << 16;
  at::parallel_for(0, src.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (isa >= Isa::kAvx512) {
      avx512::fp8_to_bf16(s + b, d + b, e - b);
    } else if (isa >= Isa::kAvx2) {
      avx2::fp8_to_bf16(s + b, d + b, e - b);
    } else {
      for (int64_t i = b; i < e; ++i) d[i] = fp8_to_bf16_scalar(s[i]);
    }
  });
  return out;
}

}  // namespace fp8serve
