// The ISA level used by every op, decided once per process: the best level the host
// supports (cpuid + OS state), optionally lowered by
// FP8SERVE_ISA=scalar|avx2|avx512|avx512_vbmi|amx (avx512_vbmi: table-based FP8 decode).
// Asking for more than the host has is clamped to the host level with a warning, never
// an illegal instruction.
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <cstdlib>
#include <cstring>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpuid.h"
#include "isa.h"

namespace fp8serve {
namespace {

// Linux hands out AMX tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA); without it the first tile instruction faults (SIGILL), even where
// cpuid and XCR0 report AMX. Idempotent; ext/cpu.py asks too.
bool amx_granted() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}

Isa detect_host() {
  auto f = cpu_features();
  bool avx512 = has_feature(f, "avx512f") && has_feature(f, "avx512bw") &&
                has_feature(f, "avx512vl") && has_feature(f, "avx512_bf16");
  const bool vbmi = avx512 && cpu_has_avx512_vbmi();
  // kAmx is a level above kAvx512Vbmi: the tile kernel's unpack is the VBMI table (every
  // AMX CPU so far, Sapphire Rapids on, has VBMI)
  if (vbmi && has_feature(f, "amx_tile") && has_feature(f, "amx_bf16") && amx_granted()) {
    return Isa::kAmx;
  }
  if (vbmi) return Isa::kAvx512Vbmi;
  if (avx512) return Isa::kAvx512;
  if (has_feature(f, "avx2") && has_feature(f, "fma") && has_feature(f, "f16c")) {
    return Isa::kAvx2;
  }
  return Isa::kScalar;
}

Isa parse_isa(const char* s, Isa fallback) {
  if (std::strcmp(s, "scalar") == 0) return Isa::kScalar;
  if (std::strcmp(s, "avx2") == 0) return Isa::kAvx2;
  if (std::strcmp(s, "avx512") == 0) return Isa::kAvx512;
  if (std::strcmp(s, "avx512_vbmi") == 0) return Isa::kAvx512Vbmi;
  if (std::strcmp(s, "amx") == 0) return Isa::kAmx;
  TORCH_WARN("FP8SERVE_ISA=", s, " is not one of scalar, avx2, avx512, avx512_vbmi, amx; ignored");
  return fallback;
}

Isa choose() {
  Isa host = host_isa();
  const char* env = std::getenv("FP8SERVE_ISA");
  if (env == nullptr || *env == '\0') return host;
  Isa want = parse_isa(env, host);
  if (static_cast<int>(want) > static_cast<int>(host)) {
    TORCH_WARN("FP8SERVE_ISA=", env, " exceeds this host (", isa_name(host), "); using ",
               isa_name(host));
    return host;
  }
  return want;
}

}  // namespace

Isa host_isa() {
  static const Isa isa = detect_host();
  return isa;
}

Isa cpu_isa() {
  static const Isa isa = choose();
  return isa;
}

bool use_vbmi() {
  static const bool on = cpu_isa() >= Isa::kAvx512Vbmi && cpu_has_avx512_vbmi();
  return on;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAmx: return "amx";
    case Isa::kAvx512Vbmi: return "avx512_vbmi";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace fp8serve
