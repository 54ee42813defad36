// cpuid probe; see cpuid.h.
#include "cpuid.h"

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FP8S_X86 1
#endif

namespace fp8serve {
namespace {

#ifdef FP8S_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }
#endif

}  // namespace

std::vector<std::string> cpu_features() {
  std::vector<std::string> out;
#ifdef FP8S_X86
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  Regs l1 = cpuid(1, 0);
  if (!bit(l1.c, 27)) return out;  // OSXSAVE: no XGETBV, no AVX state
  uint64_t xcr0 = xgetbv0();
  bool os_avx = (xcr0 & 0x6) == 0x6;
  bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
  bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);
  Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  Regs l71 = max_leaf >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  auto add = [&](bool ok, const char* name) {
    if (ok) out.emplace_back(name);
  };
  bool avx = os_avx && bit(l1.c, 28);
  add(avx && bit(l7.b, 5), "avx2");
  add(avx && bit(l1.c, 12), "fma");
  add(avx && bit(l1.c, 29), "f16c");
  bool f = os_avx512 && bit(l7.b, 16);
  add(f, "avx512f");
  add(f && bit(l7.b, 30), "avx512bw");
  add(f && bit(l7.b, 31), "avx512vl");
  add(f && bit(l7.c, 11), "avx512_vnni");
  add(f && bit(l71.a, 5), "avx512_bf16");
  bool tile = os_amx && bit(l7.d, 24);
  add(tile, "amx_tile");
  add(tile && bit(l7.d, 22), "amx_bf16");
  add(tile && bit(l7.d, 25), "amx_int8");
  add(tile && bit(l71.a, 21), "amx_fp16");
#endif
  return out;
}

bool cpu_has_avx512_vbmi() {
#ifdef FP8S_X86
  Regs l1 = cpuid(1, 0);
  if (!bit(l1.c, 27) || (xgetbv0() & 0xE6) != 0xE6) return false;
  return __get_cpuid_max(0, nullptr) >= 7 && bit(cpuid(7, 0).c, 1);
#else
  return false;
#endif
}

bool has_feature(const std::vector<std::string>& feats, const char* name) {
  return std::find(feats.begin(), feats.end(), name) != feats.end();
}

}  // namespace fp8serve
