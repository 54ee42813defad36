// A step of a few token rows through the decoder stack in one parallel region (contract
// in decode_team.h).
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "attention.h"
#include "decode_layer.h"
#include "decode_team.h"
#include "gemm.h"
#include "team_profile.h"
#include "tile_sched.h"

namespace fp8serve {
namespace {

// Spin barrier for one team; yields after a few microseconds so a descheduled teammate
// (shared 2-core hosts) gets the core back.
struct SpinBarrier {
  static constexpr int kSpins = 2000;
  alignas(64) std::atomic<int64_t> arrived{0};
  alignas(64) std::atomic<int64_t> generation{0};
  int64_t team = 1;

  void wait() {
    if (team == 1) return;
    const int64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == team) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < kSpins) {
        __builtin_ia32_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }
};

constexpr int kPhases = 5;  // claimable phases per layer: qkv, attention, o, gu, down

// How a phase's items are shared out. 1 (default): one contiguous part per thread (the
// static split, in whole claims), each claimed from its front, so every thread streams its
// weight forward (as the prefetchers and the AMX walk's software prefetch expect), then
// the other parts' backs stolen: the scheme of tile_sched.h, which every GEMM outside the
// team uses. 0: one range, claimed from the front by even threads and from the back by odd
// ones (measured on Zen 5, demo and 3B decode: no difference beyond the host's noise; not
// yet timed on AMX). Which thread computes a tile never changes its bits.
#ifndef FP8S_TEAM_SPLIT
#define FP8S_TEAM_SPLIT 1
#endif

struct Shared {
  const StepRef& step;
  uint16_t* h;                    // bf16 [T, H]
  uint16_t *qkv, *o, *gu, *down;  // bf16 [T, (Hq + 2 Hkv) D], [T, H], [T, 2 I], [T, H]
  uint16_t* attn;                 // bf16 [T, Hq D] (attention by whole rows)
  float* part;                    // attention partials [T Hkv nseg partial_floats]
  int64_t nseg;                   // 0: whole (row, KV head) items, else segments per row
  int64_t xld;                    // row stride of the private x buffers: max(H, I)
  TileRange* ranges;              // [n_layers * kPhases][parts] (FP8S_TEAM_SPLIT)
  int64_t parts;                  // ranges per phase: 1, or the team size
  const RowOps& ops;              // row_ops() and vector_kernel(), looked up once a step
  const VectorKernel& kern;
  SpinBarrier barrier;
};

struct Private {  // one thread's buffers
  uint16_t* x;     // bf16 [T, xld]: normed h, or silu(g) * u
  uint16_t* attn;  // bf16 [T, Hq D]: the merged attention (segment mode)
  float* xf;       // fp32 [T, max(xld, Hq D)]: a GEMM's x widened (the AVX2 GEMM's
                   // operand; null when no layer runs it)
  float* xs;       // fp32, as xf: xf times a column block's scales (AVX2 GEMM with block
                   // scales; null when no layer has them)
};

// Columns per weight tile: 32 (vnni32), 16 (avx2_16).
int64_t tile_cols(const LinearRef& l) { return l.kind == GemmKind::kAvx2 ? kTileN2 : kTileN; }

// Tiles per claim: the direct kernel's tile group (4 at M = 1, pairs below 8 rows); the
// AVX2 tiles are half as wide.
int64_t gemm_chunk(const LinearRef& l, int64_t rows) {
  return (rows == 1 ? 4 : 2) * (l.kind == GemmKind::kAvx2 ? 2 : 1);
}

// The AVX2 GEMM's x: rows [T, kp] of bf16 x (stride ldx) widened to fp32 at xf, prescaled
// (avx2::prescale_x) when `prescale` and every value allows it; returns whether it did.
// The same rows give the same answer in every thread, and the GEMM's bits do not depend on
// it (isa.h).
bool widen_rows(const uint16_t* x, int64_t ldx, int64_t rows, int64_t kp, float* xf,
                bool prescale) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kp; ++i) {
      const uint32_t u = uint32_t(x[r * ldx + i]) << 16;
      __builtin_memcpy(xf + r * kp + i, &u, 4);
    }
  }
  return prescale && avx2::prescale_x(xf, rows * kp);
}

// y [T, N] = x [T, ldx] @ W.T over tiles [t0, t1) (gemm.h: the AMX tile GEMM with its
// generated rows on the AVX-512 one, or the AVX-512 one on its direct path: T <= 32; isa.h
// avx2::gemm_tiles on xf, widened by widen_rows)
void gemm_tiles(const LinearRef& l, int64_t rows, const uint8_t* generated, const uint16_t* x,
                int64_t ldx, const Private& p, bool prescaled, uint16_t* y, int64_t t0,
                int64_t t1) {
  if (l.kind == GemmKind::kAvx2 && l.bk != 0) {
    avx2::gemm_tiles_block(p.xf, rows, l.kp, l.w, l.n, l.scale, l.bn, l.bk, nullptr, y, t0,
                           t1, p.xs);
    return;
  }
  if (l.kind == GemmKind::kAvx2) {
    avx2::gemm_tiles(p.xf, rows, l.kp, l.w, l.n, l.scale, nullptr, y, t0, t1, prescaled);
    return;
  }
  if (l.kind == GemmKind::kAmx) {  // prompt rows on the tiles, generated rows on AVX-512
    for_row_runs(generated, rows, [&](int64_t r0, int64_t r1, bool gen) {
      const GemvArgs a{x + r0 * ldx, ldx, r1 - r0, l.w, l.kp, l.n, l.scale, l.bn, l.bk,
                       l.k_blocks, nullptr, y + r0 * l.n, l.n};
      if (gen) {
        fp8_linear_tiles(a, t0, t1, kTeamMaxRows);
      } else {
        amx_linear_tiles(a, t0, t1);
      }
    });
    return;
  }
  const GemvArgs a{x, ldx, rows, l.w, l.kp, l.n, l.scale, l.bn, l.bk, l.k_blocks, nullptr, y,
                   l.n};
  fp8_linear_tiles(a, t0, t1, kTeamMaxRows);
}

// Claims chunks of a phase's ranges rs[parts] and runs fn(t0, t1) on each: one range,
// thread parity picking the end; or the thread's own part from its front, then the
// others' from their backs.
template <class F>
void claim_all(TileRange* rs, int64_t parts, int tid, int64_t chunk, const F& fn) {
  int64_t t0 = 0, t1 = 0;
  if (parts == 1) {
    while (rs[0].claim(chunk, tid % 2 == 1, t0, t1)) fn(t0, t1);
    return;
  }
  for (int64_t j = 0; j < parts; ++j) {
    TileRange& r = rs[(tid + j) % parts];
    while (r.claim(chunk, j != 0, t0, t1)) fn(t0, t1);
  }
}

// A phase's items [0, n) as `parts` ranges: contiguous, in whole claims of `chunk`.
void split_range(TileRange* rs, int64_t parts, int64_t n, int64_t chunk) {
  const int64_t claims = (n + chunk - 1) / chunk;
  for (int64_t i = 0; i < parts; ++i) {
    rs[i].set(std::min(n, claims * i / parts * chunk),
              std::min(n, claims * (i + 1) / parts * chunk));
  }
}

// y = x @ W.T over claimed tiles; with `residual`, h[:, cols] += y[:, cols] for those tiles.
void gemm_phase(Shared& s, TileRange* range, int tid, const LinearRef& l, const uint16_t* x,
                int64_t ldx, uint16_t* y, bool residual, const Private& p) {
  const int64_t rows = s.step.t_n, cols = tile_cols(l);
  const bool prescaled =
      l.kind == GemmKind::kAvx2 && widen_rows(x, ldx, rows, l.kp, p.xf, l.bk == 0);
  claim_all(range, s.parts, tid, gemm_chunk(l, rows), [&](int64_t t0, int64_t t1) {
    gemm_tiles(l, rows, s.step.generated, x, ldx, p, prescaled, y, t0, t1);
    if (residual) {
      const int64_t c0 = t0 * cols, c1 = std::min(t1 * cols, l.n);
      for (int64_t r = 0; r < rows; ++r) {
        s.ops.add_row(s.h + r * s.step.hid + c0, y + r * l.n + c0, c1 - c0);
      }
    }
  });
}

int64_t qkv_cols(const StepRef& t) { return (t.hq + 2 * t.hkv) * t.d; }

AttnArgs attn_args(const Shared& s, const LayerRef& l, uint16_t* out) {
  const StepRef& t = s.step;
  AttnArgs a{s.qkv, qkv_cols(t), t.d, l.k_cache, l.v_cache, t.hq, t.hkv, t.d,
             t.block_size, t.block_tables, t.bt_stride, t.token_seq, t.ctx_lens,
             float(1.0 / __builtin_sqrt(double(t.d))), out, t.hq * t.d};
  a.k8 = l.k8;
  a.v8 = l.v8;
  a.ks = l.ks;
  a.vs = l.vs;
  return a;
}

// rope on q and k of rows r = tid, tid + team, ..., then their K/V rows into the cache.
void rope_and_store(const Shared& s, const LayerRef& l, int tid, int64_t team) {
  const StepRef& t = s.step;
  const int64_t half = t.d / 2, ld = qkv_cols(t);
  for (int64_t r = tid; r < t.t_n; r += team) {
    uint16_t* qkv = s.qkv + r * ld;
    const int64_t off = t.positions[r] * half;
    for (int64_t hd = 0; hd < t.hq + t.hkv; ++hd) {
      const bool q = hd < t.hq;
      s.ops.rope_row(qkv + hd * t.d, (q ? t.q_cos : t.cos) + off,
                     (q ? t.q_sin : t.sin) + off, half);
    }
    const uint16_t* k = qkv + t.hq * t.d;
    const uint16_t* v = qkv + (t.hq + t.hkv) * t.d;
    for (int64_t h = 0; h < t.hkv; ++h) {  // as kv_write / kv_write_fp8 (attention.h kv_row)
      const int64_t row = kv_row(t.slots[r], h, t.hkv, t.block_size);
      if (l.k8 == nullptr) {
        std::copy_n(k + h * t.d, t.d, l.k_cache + row * t.d);
        std::copy_n(v + h * t.d, t.d, l.v_cache + row * t.d);
        continue;
      }
      l.ks[row] = quantize_kv_row(k + h * t.d, t.d, l.k_static, l.k8 + row * t.d);
      l.vs[row] = quantize_kv_row(v + h * t.d, t.d, l.v_static, l.v8 + row * t.d);
    }
  }
}

void rms_norm_rows(const Shared& s, const uint16_t* w, const Private& p) {
  const StepRef& t = s.step;
  for (int64_t r = 0; r < t.t_n; ++r) {
    s.ops.rms_norm_row(s.h + r * t.hid, w, t.hid, t.eps, p.x + r * s.xld);
  }
}

// The layer's attention output rows [T, Hq D]: written to s.attn by whole rows (then a
// barrier), or as segment partials merged by every thread into its own p.attn.
const uint16_t* attention(Shared& s, const LayerRef& l, TileRange* range, int tid,
                          const Private& p) {
  if (s.nseg == 0) {
    const AttnArgs a = attn_args(s, l, s.attn);
    claim_all(range, s.parts, tid, 1,
              [&](int64_t i0, int64_t i1) { s.kern.items(a, i0, i1); });
    s.barrier.wait();
    return s.attn;
  }
  const AttnArgs a = attn_args(s, l, p.attn);
  claim_all(range, s.parts, tid, 1, [&](int64_t i0, int64_t i1) {
    s.kern.segments(a, s.nseg, i0, i1, s.part);
  });
  s.barrier.wait();
  s.kern.merge(a, s.nseg, 0, s.step.t_n * s.step.hkv, s.part);
  return p.attn;
}

void layer(Shared& s, const LayerRef& l, TileRange* ranges, int tid, int64_t team,
           const Private& p, PartClock& clock) {
  const StepRef& t = s.step;
  rms_norm_rows(s, l.input_norm, p);
  clock.mark(kPartNorm);
  gemm_phase(s, ranges, tid, l.qkv, p.x, s.xld, s.qkv, false, p);
  clock.mark(kPartQkv);
  s.barrier.wait();
  clock.mark(kPartWait);
  rope_and_store(s, l, tid, team);
  clock.mark(kPartRope);
  s.barrier.wait();
  clock.mark(kPartWait);
  const uint16_t* a = attention(s, l, ranges + s.parts, tid, p);
  clock.mark(kPartAttn);
  gemm_phase(s, ranges + 2 * s.parts, tid, l.o, a, t.hq * t.d, s.o, true, p);
  clock.mark(kPartO);
  s.barrier.wait();
  clock.mark(kPartWait);
  rms_norm_rows(s, l.post_norm, p);
  clock.mark(kPartNorm);
  gemm_phase(s, ranges + 3 * s.parts, tid, l.gu, p.x, s.xld, s.gu, false, p);
  clock.mark(kPartGu);
  s.barrier.wait();
  clock.mark(kPartWait);
  for (int64_t r = 0; r < t.t_n; ++r) {
    const uint16_t* g = s.gu + r * 2 * t.inter;
    s.ops.silu_mul_row(g, g + t.inter, t.inter, p.x + r * s.xld);
  }
  clock.mark(kPartSilu);
  gemm_phase(s, ranges + 4 * s.parts, tid, l.down, p.x, s.xld, s.down, true, p);
  clock.mark(kPartDown);
  s.barrier.wait();
  clock.mark(kPartWait);
}

int64_t tiles(const LinearRef& l) { return (l.n + tile_cols(l) - 1) / tile_cols(l); }

// Threads for the region: spinning teammates must each have a CPU, so never more than the
// CPUs this process may run on (more threads than that would wait on every barrier).
int64_t team_size(int64_t threads) {
  cpu_set_t set;
  const int64_t cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max<int64_t>(1, std::min(threads, cpus));
}

// Attention work split: whole (row, KV head) items when there are enough of them to keep
// the team busy (or no row has more than one segment), else their 128-key segments.
int64_t attention_segments(const StepRef& t, int64_t team) {
  int64_t nseg = 1;
  for (int64_t r = 0; r < t.t_n; ++r) nseg = std::max(nseg, num_segments(t.ctx_lens[r]));
  return nseg == 1 || t.t_n * t.hkv >= 2 * team ? 0 : nseg;
}

}  // namespace

void decode_team(const StepRef& step, const LayerRef* layers, int64_t n_layers, uint16_t* h,
                 int64_t threads) {
  const int64_t team_max = team_size(threads), rows = step.t_n;
  const int64_t nseg = attention_segments(step, team_max);
  const int64_t xld = std::max(step.hid, step.inter), attn_cols = step.hq * step.d;
  const int64_t priv = rows * (xld + attn_cols);
  std::vector<uint16_t> buf(size_t(rows * (qkv_cols(step) + 2 * step.hid + 2 * step.inter +
                                           attn_cols) + team_max * priv));
  const AttnArgs probe{nullptr, 0, 0, nullptr, nullptr, step.hq, step.hkv, step.d, 0, nullptr,
                       0, nullptr, nullptr, 0.0f, nullptr, 0};
  std::vector<float> part(size_t(rows * step.hkv * nseg * partial_floats(probe)));
  // fp32 x per thread for the AVX2 GEMM (K up to max(H, I, Hq D))
  bool avx2_gemm = false, avx2_block = false;
  for (int64_t i = 0; i < n_layers; ++i) {
    const LayerRef& l = layers[i];
    avx2_gemm |= l.qkv.kind == GemmKind::kAvx2;
    for (const LinearRef* r : {&l.qkv, &l.o, &l.gu, &l.down}) {
      avx2_block |= r->kind == GemmKind::kAvx2 && r->bk != 0;
    }
  }
  const int64_t xf_row = std::max(xld, attn_cols);
  std::vector<float> xf(avx2_gemm ? size_t(team_max * rows * xf_row) : 0);
  std::vector<float> xs(avx2_block ? size_t(team_max * rows * xf_row) : 0);
  const int64_t parts = FP8S_TEAM_SPLIT ? team_max : 1;
  std::unique_ptr<TileRange[]> ranges(new TileRange[n_layers * kPhases * parts]);
  const int64_t attn_items = rows * step.hkv * std::max<int64_t>(nseg, 1);
  for (int64_t i = 0; i < n_layers; ++i) {
    const LayerRef& l = layers[i];
    const int64_t items[kPhases] = {tiles(l.qkv), attn_items, tiles(l.o), tiles(l.gu),
                                    tiles(l.down)};
    const int64_t chunks[kPhases] = {gemm_chunk(l.qkv, rows), 1, gemm_chunk(l.o, rows),
                                     gemm_chunk(l.gu, rows), gemm_chunk(l.down, rows)};
    for (int j = 0; j < kPhases; ++j) {
      split_range(ranges.get() + (i * kPhases + j) * parts, parts, items[j], chunks[j]);
    }
  }
  uint16_t* b = buf.data();
  Shared s{step, h, b, nullptr, nullptr, nullptr, nullptr, part.data(), nseg, xld,
           ranges.get(), parts, row_ops(), vector_kernel(), {}};
  s.o = s.qkv + rows * qkv_cols(step);
  s.gu = s.o + rows * step.hid;
  s.down = s.gu + rows * 2 * step.inter;
  s.attn = s.down + rows * step.hid;
  uint16_t* priv0 = s.attn + rows * attn_cols;
#pragma omp parallel num_threads(int(team_max))
  {
    const int tid = omp_get_thread_num();
    const int64_t team = omp_get_num_threads();
    if (tid == 0) s.barrier.team = team;
#pragma omp barrier
    const Private p{priv0 + tid * priv, priv0 + tid * priv + rows * xld,
                    avx2_gemm ? xf.data() + tid * rows * xf_row : nullptr,
                    avx2_block ? xs.data() + tid * rows * xf_row : nullptr};
    PartClock clock(tid);
    for (int64_t i = 0; i < n_layers; ++i) {
      layer(s, layers[i], s.ranges + i * kPhases * parts, tid, team, p, clock);
    }
  }
  if (FP8S_TEAM_PROFILE) TeamProfile::get().call_done(team_max, n_layers);
}

}  // namespace fp8serve
