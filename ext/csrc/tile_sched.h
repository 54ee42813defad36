// Dynamic split of a GEMM's 32-column tiles over torch's intra-op threads (generic
// translation units only: includes ATen).
//
// Why dynamic: the 2-core hosts this serves on are shared with the HTTP server, the
// tokenizer and other processes, so one of the threads is often descheduled in the middle
// of a GEMM. With a static split (at::parallel_for's contiguous ranges) the whole GEMM
// then waits for that thread's range. Here each thread starts on its own contiguous range
// (the static split: one weight stream per thread, as good for the prefetchers) claiming
// chunks from its front, and when that is done takes chunks from the BACK of the other
// threads' ranges, so a running thread finishes the work of a stalled one. A range is one
// atomic 64-bit word (front | back << 32) changed by compare-exchange, so every tile is
// claimed exactly once. Batch invariance is untouched: a tile's outputs are computed by
// the same code whichever thread claims it (no reduction across tiles or threads).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace fp8serve {

// Tiles per claim: about 8 claims per thread (one compare-exchange per several us of
// streaming), at most kMaxTileChunk tiles, a multiple of `step` (the kernel's tile
// group: 2 for the paired-tile paths, 1 where single tiles run as fast).
constexpr int64_t kMaxTileChunk = 32;

inline int64_t tile_chunk(int64_t tiles, int64_t threads, int64_t step) {
  int64_t c = tiles / (8 * threads);
  c = c > kMaxTileChunk ? kMaxTileChunk : c;
  c -= c % step;
  return c < step ? step : c;
}

// One thread's remaining tiles [front, back), padded to its own cache line.
struct alignas(64) TileRange {
  std::atomic<uint64_t> v{0};

  void set(int64_t front, int64_t back) {
    v.store(uint64_t(front) | (uint64_t(back) << 32), std::memory_order_relaxed);
  }
  // Claims up to `chunk` tiles from the front (owner) or the back (thief) into [t0, t1).
  bool claim(int64_t chunk, bool from_back, int64_t& t0, int64_t& t1) {
    uint64_t cur = v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = int64_t(cur & 0xFFFFFFFFu), b = int64_t(cur >> 32);
      if (f >= b) return false;
      t0 = from_back ? (b - chunk > f ? b - chunk : f) : f;
      t1 = from_back ? b : (f + chunk < b ? f + chunk : b);
      const uint64_t next = from_back ? uint64_t(f) | (uint64_t(t0) << 32)
                                      : uint64_t(t1) | (uint64_t(b) << 32);
      if (v.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return true;
    }
  }
};

// fn(t0, t1) for disjoint [t0, t1) covering [0, tiles), each exactly once, on up to
// at::get_num_threads() threads (inline on the caller inside a parallel region or with
// one thread). tiles < 2^31. max_chunk caps the tiles per claim (rounded to a multiple
// of step): callers whose tiles each take long (a prefill GEMM's tile is ~0.1 ms) claim
// one step at a time, so the last claim leaves the other threads idle only briefly.
template <class F>
void parallel_tiles(int64_t tiles, int64_t step, const F& fn,
                    int64_t max_chunk = kMaxTileChunk) {
  if (tiles <= 0) return;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (threads <= 1 || tiles <= step) {
    fn(int64_t(0), tiles);
    return;
  }
  const int64_t cap = std::max(step, max_chunk - max_chunk % step);
  const int64_t chunk = std::min(tile_chunk(tiles, threads, step), cap);
  const int64_t steps = (tiles + step - 1) / step;
  std::unique_ptr<TileRange[]> ranges(new TileRange[threads]);
  for (int64_t i = 0; i < threads; ++i) {  // the static split, in whole steps
    ranges[i].set(std::min(tiles, steps * i / threads * step),
                  std::min(tiles, steps * (i + 1) / threads * step));
  }
  at::parallel_for(0, threads, 1, [&](int64_t i0, int64_t) {
    int64_t t0 = 0, t1 = 0;
    while (ranges[i0].claim(chunk, false, t0, t1)) fn(t0, t1);
    for (int64_t j = 1; j < threads; ++j) {
      TileRange& victim = ranges[(i0 + j) % threads];
      while (victim.claim(chunk, true, t0, t1)) fn(t0, t1);
    }
  });
}

}  // namespace fp8serve
