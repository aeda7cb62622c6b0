// Spreading independent work items over the CPU cores.
//
// Plain threads spawned per call and joined before returning: a few tens of
// microseconds, paid only by calls big enough to need them. Unlike OpenMP's
// default spinning workers, nothing busy-waits between calls, so small calls
// stay fast on a loaded machine. Items are independent and each writes its own
// outputs, so results do not depend on the schedule.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace jcc {

// Cores to use: JAX_CAUSAL_CONV_NUM_THREADS if set, else all of them.
inline int NumThreads() {
  static const int n = [] {
    if (const char* env = std::getenv("JAX_CAUSAL_CONV_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return v;
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return n;
}

// Calls fn(ctx, i) for i in [0, n); in parallel when the total work (in
// multiply-adds, roughly) is worth more than starting threads. Each worker
// first builds its own ctx = make() (scratch buffers, say) and reuses it for
// all the items it runs, so per-item costs stay small.
//
// Worker t starts on its own contiguous share of the items, so each thread
// streams through its own region of memory (and first-touch page faults on
// fresh outputs land in different page tables), then helps the others finish
// theirs: a descheduled thread on a loaded machine delays nobody for long.
template <typename Make, typename Fn>
void ParallelForWith(int64_t n, int64_t work_per_item, Make make, Fn fn) {
  constexpr int64_t kMinWorkPerThread = int64_t(1) << 18;
  const int64_t threads = std::min<int64_t>(
      {int64_t(NumThreads()), n, std::max<int64_t>(1, n * work_per_item / kMinWorkPerThread)});
  if (threads <= 1) {
    if (n <= 0) return;
    auto ctx = make();
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  struct Share {
    std::atomic<int64_t> next;
    int64_t end;
  };
  std::vector<Share> shares(threads);
  for (int64_t t = 0; t < threads; ++t) {
    shares[t].next = n * t / threads;
    shares[t].end = n * (t + 1) / threads;
  }
  auto worker = [&](int64_t t) {
    auto ctx = make();
    for (int64_t k = 0; k < threads; ++k) {
      Share& s = shares[(t + k) % threads];
      for (int64_t i = s.next++; i < s.end; i = s.next++) fn(ctx, i);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
}

// Calls fn(i) for i in [0, n), like ParallelForWith without a context.
template <typename Fn>
void ParallelFor(int64_t n, int64_t work_per_item, Fn fn) {
  ParallelForWith(n, work_per_item, [] { return 0; }, [&](int, int64_t i) { fn(i); });
}

}  // namespace jcc
