// The portable GEMMs: FP8 (avx2_16 weight, per-channel or block scales) and BF16 (the
// lm_head), batch-invariant on any CPU the extension builds for. Baseline ISA, no
// intrinsics: GCC/Clang vector extensions (4 x fp32, SSE2 on x86-64, NEON on aarch64).
// They serve the hosts below AVX2 (or FP8SERVE_ISA=scalar), where the torch kernels would
// make a row's bits depend on the batch.
//
// Arithmetic, per output y[r, n]: one fp32 chain over k in increasing order,
// acc = fl(acc + fl(x[r, k] * w[n, k])) (a multiply, then an add, each rounded: no fused
// multiply-add, contraction off below), x widened exactly from bf16, w exactly from FP8
// (a 256-entry table) or bf16 (a shift). Per-channel: y = bf16(fl(acc * s[n]) + bias[n]);
// block scales: each k-block's chain starts from zero and is folded in order,
// acc = fl(acc + fl(part * s[block])), then y = bf16(acc + bias[n]). The chain of an
// output depends on K alone: rows are computed in groups of up to 4 for instruction-level
// parallelism, but a group only interleaves independent chains, so neither M nor the
// other rows nor the thread changes a bit.
//
// Walk: per 16-column weight tile, K in chunks (256 deep, or one k-block) widened once to
// fp32 into a per-thread buffer (16 KiB), then every row group runs the chunk (up to 4
// rows: widened as read, no buffer); per-channel chains carry across chunks in a
// per-thread [M][16] accumulator.
#include <cstdint>
#include <cstring>
#include <vector>

#include "isa.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace fp8serve {
namespace portable {
namespace {

typedef float v4f __attribute__((vector_size(16)));

constexpr int64_t kChunk = 256;  // k per widened chunk (per-channel scales)
constexpr int kGroup = 4;        // rows per group (independent chains)

struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int c = 0; c < 256; ++c) {
      const uint32_t u = uint32_t(fp8_to_bf16_scalar(uint8_t(c))) << 16;
      std::memcpy(&v[c], &u, 4);
    }
  }
};

const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

// w rows [k0, k0 + len) of one tile ([K][16]) -> wf [len][16] fp32, exactly
void widen(const uint8_t* w, int64_t len, float* wf) {
  const float* t = fp8_table().v;
  for (int64_t i = 0; i < len * kTileN2; ++i) wf[i] = t[w[i]];
}

void widen(const uint16_t* w, int64_t len, float* wf) {
  for (int64_t i = 0; i < len * kTileN2; ++i) {
    const uint32_t u = uint32_t(w[i]) << 16;
    std::memcpy(wf + i, &u, 4);
  }
}

inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, 16);
  return v;
}

// 4 weight values from their codes (the same values widen() stores)
inline v4f load4(const uint8_t* p) {
  const float* t = fp8_table().v;
  return v4f{t[p[0]], t[p[1]], t[p[2]], t[p[3]]};
}

inline v4f load4(const uint16_t* p) {
  v4f v;
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = uint32_t(p[i]) << 16;
    std::memcpy(&v[i], &u, 4);
  }
  return v;
}

inline void store4(float* p, v4f v) { std::memcpy(p, &v, 16); }

// R rows' chains over one widened chunk: c[r][0..16) = fresh ? 0 : c[r], then for k in
// order c[r] = c[r] + x[r][k] * wf[k]. x rows at xr[r] (already offset to the chunk).
// wf: the chunk widened to fp32 [len][16], or its codes (uint8_t FP8, uint16_t bf16),
// widened as they are read (decode rows: no buffer round trip; the same values).
template <int R, class W>
void rows_chunk(const float* const* xr, const W* wf, int64_t len, float* const* c,
                bool fresh) {
  v4f a[R][4];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < 4; ++i) a[r][i] = fresh ? v4f{0, 0, 0, 0} : load4(c[r] + 4 * i);
  }
  for (int64_t k = 0; k < len; ++k) {
    const W* wk = wf + k * kTileN2;
    const v4f w0 = load4(wk), w1 = load4(wk + 4), w2 = load4(wk + 8), w3 = load4(wk + 12);
    for (int r = 0; r < R; ++r) {
      const float xv = xr[r][k];
      const v4f xb = {xv, xv, xv, xv};
      a[r][0] = a[r][0] + xb * w0;
      a[r][1] = a[r][1] + xb * w1;
      a[r][2] = a[r][2] + xb * w2;
      a[r][3] = a[r][3] + xb * w3;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < 4; ++i) store4(c[r] + 4 * i, a[r][i]);
  }
}

// every row's chain over one chunk [k0, k0 + len): into acc rows (stride 16) directly
// (fresh: from zero), or (block) into part, then acc = acc + part * s
template <class W>
void all_rows(const float* x, int64_t m, int64_t k, int64_t k0, int64_t len, const W* wf,
              float* acc, float* part, bool fresh, bool block, float s) {
  for (int64_t r0 = 0; r0 < m; r0 += kGroup) {
    const int64_t g = m - r0 < kGroup ? m - r0 : kGroup;
    const float* xr[kGroup];
    float* c[kGroup];
    for (int64_t i = 0; i < g; ++i) {
      xr[i] = x + (r0 + i) * k + k0;
      c[i] = block ? part + i * kTileN2 : acc + (r0 + i) * kTileN2;
    }
    const bool from_zero = fresh || block;
    if (g == 4) {
      rows_chunk<4>(xr, wf, len, c, from_zero);
    } else if (g == 3) {
      rows_chunk<3>(xr, wf, len, c, from_zero);
    } else if (g == 2) {
      rows_chunk<2>(xr, wf, len, c, from_zero);
    } else {
      rows_chunk<1>(xr, wf, len, c, from_zero);
    }
    if (block) {
      const v4f sv = {s, s, s, s};
      for (int64_t i = 0; i < g; ++i) {
        float* a = acc + (r0 + i) * kTileN2;
        for (int j = 0; j < 4; ++j) {
          const v4f p = load4(part + i * kTileN2 + 4 * j);
          store4(a + 4 * j, fresh ? p * sv : load4(a + 4 * j) + p * sv);
        }
      }
    }
  }
}

inline uint16_t to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Scratch {
  std::vector<float> wf, acc, part;
};

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// The walk over tiles [t0, t1) of weight W (uint8_t FP8 or uint16_t bf16 codes).
// scale: per-channel [N] (bk == 0), block [ceil(N/bn), ceil(K/bk)], or null (none).
template <class W>
void walk(const float* x, int64_t m, int64_t k, const W* w, int64_t n, const float* scale,
          int64_t bn, int64_t bk, const float* bias, void* y, bool y_fp32, int64_t t0,
          int64_t t1) {
  if (m <= 0 || t0 >= t1) return;
  const bool block = bk > 0;
  const int64_t chunk = block ? bk : kChunk, kb_n = block ? (k + bk - 1) / bk : 0;
  Scratch& sc = thread_scratch();
  sc.wf.resize(size_t(chunk * kTileN2));
  sc.acc.resize(size_t(m * kTileN2));
  sc.part.resize(size_t(kGroup * kTileN2));
  float* wf = sc.wf.data();
  float* acc = sc.acc.data();
  for (int64_t t = t0; t < t1; ++t) {
    const W* wt = w + t * k * kTileN2;
    const int64_t n0 = t * kTileN2, cols = n - n0 < kTileN2 ? n - n0 : kTileN2;
    const float* bs = block ? scale + (n0 / bn) * kb_n : nullptr;
    if (k == 0) std::memset(acc, 0, size_t(m * kTileN2) * 4);
    for (int64_t k0 = 0, kb = 0; k0 < k; k0 += chunk, ++kb) {
      const int64_t len = k - k0 < chunk ? k - k0 : chunk;
      const float s = block ? bs[kb] : 1.0f;
      if (m <= kGroup) {  // one row group: widen as it reads
        all_rows(x, m, k, k0, len, wt + k0 * kTileN2, acc, sc.part.data(), k0 == 0, block, s);
      } else {
        widen(wt + k0 * kTileN2, len, wf);
        all_rows(x, m, k, k0, len, wf, acc, sc.part.data(), k0 == 0, block, s);
      }
    }
    for (int64_t r = 0; r < m; ++r) {
      const float* a = acc + r * kTileN2;
      for (int64_t j = 0; j < cols; ++j) {
        float v = block || !scale ? a[j] : a[j] * scale[n0 + j];
        if (bias) v = v + bias[n0 + j];
        if (y_fp32) {
          static_cast<float*>(y)[r * n + n0 + j] = v;
        } else {
          static_cast<uint16_t*>(y)[r * n + n0 + j] = to_bf16(v);
        }
      }
    }
  }
}

}  // namespace

void gemm_tiles(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                const float* scale, int64_t bn, int64_t bk, const float* bias, uint16_t* y,
                int64_t t0, int64_t t1) {
  walk(x, m, k, w, n, scale, bn, bk, bias, y, false, t0, t1);
}

void bf16_gemm_tiles(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                     const float* bias, void* y, bool y_fp32, int64_t t0, int64_t t1) {
  walk(x, m, k, w, n, nullptr, 0, 0, bias, y, y_fp32, t0, t1);
}

}  // namespace portable
}  // namespace fp8serve
