// The single-token decode stack in one parallel region (contract in decode_single.h).
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "attention.h"
#include "decode_layer.h"
#include "decode_single.h"
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
constexpr int64_t kGemvChunk = 4;  // tiles per claim (the M = 1 kernel's 4-tile group)

struct Shared {
  const TokenRef& tok;
  const LayerRef* layers;
  uint16_t* h;
  uint16_t *qkv, *o, *gu, *down;  // bf16 [(Hq + 2 Hkv) D], [H], [2 I], [H]
  float* part;                    // attention partials [Hkv * nseg * partial_floats]
  int64_t nseg;
  TileRange* ranges;              // [n_layers * kPhases], each set to [0, items)
  SpinBarrier barrier;
};

struct Private {  // one thread's buffers (bf16)
  uint16_t* x;     // [max(H, I)]: normed h, or silu(g) * u
  uint16_t* attn;  // [Hq * D]
};

void gemv_tiles(const LinearRef& l, const uint16_t* x, uint16_t* y, int64_t t0, int64_t t1) {
  const GemvArgs a{x, l.kp, 1, l.w, l.kp, l.n, l.scale, l.bn, l.bk, l.k_blocks, nullptr, y, l.n};
  if (use_vbmi()) {
    avx512_vbmi::direct_tiles(a, t0, t1);
  } else {
    avx512::direct_tiles(a, t0, t1);
  }
}

// Claims chunks of `range` (thread parity picks the end) and runs fn(t0, t1) on each.
template <class F>
void claim_all(TileRange& range, int tid, int64_t chunk, const F& fn) {
  int64_t t0 = 0, t1 = 0;
  while (range.claim(chunk, tid % 2 == 1, t0, t1)) fn(t0, t1);
}

// y = x @ W.T over claimed tiles; with `residual`, h[cols] += y[cols] for those tiles.
void gemv_phase(Shared& s, TileRange& range, int tid, const LinearRef& l, const uint16_t* x,
                uint16_t* y, bool residual) {
  claim_all(range, tid, kGemvChunk, [&](int64_t t0, int64_t t1) {
    gemv_tiles(l, x, y, t0, t1);
    if (residual) {
      const int64_t c0 = t0 * kTileN, c1 = std::min(t1 * kTileN, l.n);
      avx512::add_row(s.h + c0, y + c0, c1 - c0);
    }
  });
}

AttnArgs attn_args(const Shared& s, uint16_t* out) {
  const TokenRef& t = s.tok;
  const int64_t qkv_n = (t.hq + 2 * t.hkv) * t.d;
  return AttnArgs{s.qkv, qkv_n, t.d, nullptr, nullptr, t.hq, t.hkv, t.d, t.block_size,
                  t.block_table, t.bt_stride, nullptr, &t.ctx_len,
                  float(1.0 / __builtin_sqrt(double(t.d))), out, t.hq * t.d};
}

// rope on q and k of the token, then its K/V row into the cache (thread 0 only).
void rope_and_store(const Shared& s, const LayerRef& l) {
  const TokenRef& t = s.tok;
  const int64_t half = t.d / 2;
  for (int64_t hd = 0; hd < t.hq + t.hkv; ++hd) {
    const bool q = hd < t.hq;
    avx512::rope_row(s.qkv + hd * t.d, q ? t.q_cos : t.cos, q ? t.q_sin : t.sin, half);
  }
  const int64_t row = t.hkv * t.d;
  std::copy_n(s.qkv + t.hq * t.d, row, l.k_cache + t.slot * row);
  std::copy_n(s.qkv + (t.hq + t.hkv) * t.d, row, l.v_cache + t.slot * row);
}

void layer(Shared& s, const LayerRef& l, TileRange* ranges, int tid, const Private& p) {
  const TokenRef& t = s.tok;
  avx512::rms_norm_row(s.h, l.input_norm, t.hid, t.eps, p.x);
  gemv_phase(s, ranges[0], tid, l.qkv, p.x, s.qkv, false);
  s.barrier.wait();
  if (tid == 0) rope_and_store(s, l);
  s.barrier.wait();
  AttnArgs a = attn_args(s, p.attn);
  const int32_t zero = 0;
  a.token_seq = &zero;
  a.k = l.k_cache;
  a.v = l.v_cache;
  claim_all(ranges[1], tid, 1, [&](int64_t i0, int64_t i1) {
    avx512::attend_segments(a, s.nseg, i0, i1, s.part);
  });
  s.barrier.wait();
  avx512::merge_segments(a, s.nseg, 0, t.hkv, s.part);
  gemv_phase(s, ranges[2], tid, l.o, p.attn, s.o, true);
  s.barrier.wait();
  avx512::rms_norm_row(s.h, l.post_norm, t.hid, t.eps, p.x);
  gemv_phase(s, ranges[3], tid, l.gu, p.x, s.gu, false);
  s.barrier.wait();
  avx512::silu_mul_row(s.gu, s.gu + t.inter, t.inter, p.x);
  gemv_phase(s, ranges[4], tid, l.down, p.x, s.down, true);
  s.barrier.wait();
}

int64_t tiles(const LinearRef& l) { return (l.n + kTileN - 1) / kTileN; }

// Threads for the region: spinning teammates must each have a CPU, so never more than the
// CPUs this process may run on (more threads than that would wait on every barrier).
int64_t team_size(int64_t threads) {
  cpu_set_t set;
  const int64_t cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max<int64_t>(1, std::min(threads, cpus));
}

}  // namespace

void decode_single(const TokenRef& tok, const LayerRef* layers, int64_t n_layers,
                   uint16_t* h, int64_t threads) {
  const int64_t nseg = num_segments(tok.ctx_len), team_max = team_size(threads);
  const int64_t priv = std::max(tok.hid, tok.inter) + tok.hq * tok.d;
  std::vector<uint16_t> buf(size_t((tok.hq + 2 * tok.hkv) * tok.d + 2 * tok.hid +
                                   2 * tok.inter + team_max * priv));
  const AttnArgs probe{nullptr, 0, 0, nullptr, nullptr, tok.hq, tok.hkv, tok.d, 0, nullptr,
                       0, nullptr, nullptr, 0.0f, nullptr, 0};
  std::vector<float> part(size_t(tok.hkv * nseg * partial_floats(probe)));
  std::unique_ptr<TileRange[]> ranges(new TileRange[n_layers * kPhases]);
  for (int64_t i = 0; i < n_layers; ++i) {
    const LayerRef& l = layers[i];
    const int64_t items[kPhases] = {tiles(l.qkv), tok.hkv * nseg, tiles(l.o), tiles(l.gu),
                                    tiles(l.down)};
    for (int j = 0; j < kPhases; ++j) ranges[i * kPhases + j].set(0, items[j]);
  }
  uint16_t* b = buf.data();
  Shared s{tok, layers, h, b, nullptr, nullptr, nullptr, part.data(), nseg, ranges.get(), {}};
  s.o = s.qkv + (tok.hq + 2 * tok.hkv) * tok.d;
  s.gu = s.o + tok.hid;
  s.down = s.gu + 2 * tok.inter;
  uint16_t* priv0 = s.down + tok.hid;
#pragma omp parallel num_threads(int(team_max))
  {
    const int tid = omp_get_thread_num();
    if (tid == 0) s.barrier.team = omp_get_num_threads();
#pragma omp barrier
    const Private p{priv0 + tid * priv, priv0 + tid * priv + std::max(tok.hid, tok.inter)};
    for (int64_t i = 0; i < n_layers; ++i) {
      layer(s, layers[i], s.ranges + i * kPhases, tid, p);
    }
  }
}

}  // namespace fp8serve
