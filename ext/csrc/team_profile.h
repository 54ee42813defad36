// Where each team thread's time goes in a decode step (decode_team.cpp), for a diagnostic
// build only: FP8SERVE_EXT_CFLAGS=-DFP8S_TEAM_PROFILE=1. Each thread charges the time since
// its previous mark to one part of the layer (the norms, each GEMM, RoPE + KV write,
// attention with its own barrier and merge, SiLU, and the waits at the other barriers);
// every 256 team calls the sums, in microseconds per call over all layers, go to stderr
// and restart. In the default build (0) every mark compiles to nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

#ifndef FP8S_TEAM_PROFILE
#define FP8S_TEAM_PROFILE 0
#endif

namespace fp8serve {

enum TeamPart : int { kPartNorm, kPartQkv, kPartRope, kPartAttn, kPartO, kPartGu, kPartSilu,
                      kPartDown, kPartWait, kParts };

class TeamProfile {
 public:
  static constexpr int kThreads = 64;  // threads beyond this are not profiled
  static constexpr int64_t kEvery = 256;

  static TeamProfile& get() {
    static TeamProfile p;
    return p;
  }
  void add(int tid, TeamPart part, int64_t ns) {
    if (tid < kThreads) ns_[tid][part] += ns;
  }
  // after the parallel region (its threads joined): count the call, print when due
  void call_done(int64_t team, int64_t layers) {
    if (++calls_ < kEvery) return;
    static const char* const names[kParts] = {"norm", "qkv", "rope", "attn", "o",
                                              "gu",   "silu", "down", "wait"};
    std::fprintf(stderr, "fp8serve team profile: %lld calls x %lld layers, us per call\n",
                 static_cast<long long>(calls_), static_cast<long long>(layers));
    for (int t = 0; t < team && t < kThreads; ++t) {
      double total = 0;
      std::fprintf(stderr, "  thread %d:", t);
      for (int p = 0; p < kParts; ++p) {
        const double us = double(ns_[t][p]) / 1e3 / double(calls_);
        total += us;
        std::fprintf(stderr, " %s %.1f", names[p], us);
        ns_[t][p] = 0;
      }
      std::fprintf(stderr, " | total %.1f\n", total);
    }
    calls_ = 0;
  }

 private:
  int64_t ns_[kThreads][kParts] = {};
  int64_t calls_ = 0;
};

// One thread's clock: mark(part) charges the time since the previous mark to `part`.
class PartClock {
 public:
  explicit PartClock(int tid) : tid_(tid), t_(now()) {}
  void mark(TeamPart part) {
    if constexpr (FP8S_TEAM_PROFILE != 0) {
      const int64_t t = now();
      TeamProfile::get().add(tid_, part, t - t_);
      t_ = t;
    }
  }

 private:
  static int64_t now() {
    if constexpr (FP8S_TEAM_PROFILE != 0) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
    return 0;
  }
  int tid_;
  int64_t t_;
};

}  // namespace fp8serve
