// read_xor op: the memory read-bandwidth probe of the benchmarks (engine/bench/timing.py).
//   buf: any dtype, contiguous CPU tensor, nbytes a multiple of 64 (>= 64)
//   -> int64 [] : the XOR of every 64-bit little-endian word of buf (its bit pattern)
// Every thread of an OpenMP team (at::get_num_threads() threads) XORs one contiguous
// slice of whole 64-byte lines; the slices' results are XORed together. XOR is
// associative and commutative, so the result is exact and the same for any thread count
// or ISA: a caller can check that every byte was read. The per-slice loop is the
// AVX-512 or AVX2 variant (read_probe_avx512.cpp / read_probe_avx2.cpp, each compiled
// for its ISA only) chosen by the dispatch ISA, else the portable loop below.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include "isa.h"
#include "ops.h"

namespace fp8serve {
namespace {

constexpr int64_t kLine = 64;

uint64_t xor_lines_scalar(const uint64_t* w, int64_t lines) {
  uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < lines; ++i) {
    for (int j = 0; j < 8; ++j) a[j] ^= w[8 * i + j];
  }
  return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

uint64_t xor_lines(Isa isa, const uint64_t* w, int64_t lines) {
  if (isa >= Isa::kAvx512) return avx512::xor_lines(w, lines);
  if (isa >= Isa::kAvx2) return avx2::xor_lines(w, lines);
  return xor_lines_scalar(w, lines);
}

}  // namespace

at::Tensor read_xor(const at::Tensor& buf) {
  TORCH_CHECK(buf.device().is_cpu(), "read_xor: buf must be a CPU tensor, got ", buf.device());
  TORCH_CHECK(buf.is_contiguous(), "read_xor: buf must be contiguous (one dense byte range)");
  const int64_t nbytes = buf.numel() * static_cast<int64_t>(buf.element_size());
  TORCH_CHECK(nbytes >= kLine && nbytes % kLine == 0,
              "read_xor: buf must hold a positive multiple of 64 bytes (whole cache lines), "
              "got ", nbytes, " bytes");
  const auto* w = static_cast<const uint64_t*>(buf.data_ptr());
  const int64_t lines = nbytes / kLine;
  const Isa isa = cpu_isa();
  const int team = std::max(1, at::get_num_threads());
  uint64_t acc = 0;
#pragma omp parallel num_threads(team) reduction(^ : acc)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t l0 = lines * t / nt, l1 = lines * (t + 1) / nt;
    acc ^= xor_lines(isa, w + 8 * l0, l1 - l0);
  }
  return at::scalar_tensor(static_cast<int64_t>(acc), buf.options().dtype(at::kLong));
}

}  // namespace fp8serve
