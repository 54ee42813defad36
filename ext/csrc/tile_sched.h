// Dynamic split of a GEMM's 32-column tiles over torch's intra-op threads (generic
// translation units only: includes ATen).
//
// Why dynamic: the 2-core hosts this serves on are shared with the HTTP server, the
// tokenizer and other processes, so one of the threads is often descheduled in the middle
// of a GEMM. With a static split (at::parallel_for's contiguous halves) the whole GEMM
// then waits for that thread's half; here every thread claims the next chunk of tiles
// from one atomic counter until none are left, so a running thread finishes the work of
// a stalled one. Batch invariance is untouched: a tile's outputs are computed by the same
// code whichever thread claims it (no reduction across tiles or threads).
#pragma once

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>

namespace fp8serve {

// Tiles per claim: about 8 claims per thread (one atomic add per several us of
// streaming), at most kMaxTileChunk tiles, a multiple of `step` (the kernel's tile
// group: 2 for the paired-tile paths, 1 where single tiles run as fast).
constexpr int64_t kMaxTileChunk = 32;

inline int64_t tile_chunk(int64_t tiles, int64_t threads, int64_t step) {
  int64_t c = tiles / (8 * threads);
  c = c > kMaxTileChunk ? kMaxTileChunk : c;
  c -= c % step;
  return c < step ? step : c;
}

// fn(t0, t1) for disjoint [t0, t1) covering [0, tiles), each exactly once, on up to
// at::get_num_threads() threads (inline on the caller inside a parallel region or with
// one thread).
template <class F>
void parallel_tiles(int64_t tiles, int64_t step, const F& fn) {
  if (tiles <= 0) return;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (threads <= 1 || tiles == 1) {
    fn(int64_t(0), tiles);
    return;
  }
  const int64_t chunk = tile_chunk(tiles, threads, step);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t t0 = next.fetch_add(chunk); t0 < tiles; t0 = next.fetch_add(chunk)) {
      fn(t0, t0 + chunk < tiles ? t0 + chunk : tiles);
    }
  });
}

}  // namespace fp8serve
