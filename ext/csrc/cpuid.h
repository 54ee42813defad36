// cpuid + XGETBV feature probe. Names match engine/hardware.py CPU_FEATURES.
#pragma once

#include <string>
#include <vector>

namespace fp8serve {
// Features usable by user code: the cpuid bit is set AND the OS saves the matching
// register state (XCR0: bits 1-2 for AVX/AVX2/FMA/F16C, 5-7 for AVX-512, 17-18 for AMX
// tiles). AMX additionally needs a per-process arch_prctl permission on Linux, which is
// requested from Python (ext.request_amx_permission) and not reflected here.
std::vector<std::string> cpu_features();
// AVX512_VBMI (not in CPU_FEATURES; chooses the table-based conversion in C++ only).
bool cpu_has_avx512_vbmi();
bool has_feature(const std::vector<std::string>& feats, const char* name);
}  // namespace fp8serve
