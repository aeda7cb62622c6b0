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

// Calls fn(i) for i in [0, n); in parallel when the total work (in multiply-adds,
// roughly) is worth more than starting threads.
template <typename Fn>
void ParallelFor(int64_t n, int64_t work_per_item, Fn fn) {
  constexpr int64_t kMinWorkPerThread = int64_t(1) << 18;
  const int64_t threads = std::min<int64_t>(
      {int64_t(NumThreads()), n, std::max<int64_t>(1, n * work_per_item / kMinWorkPerThread)});
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace jcc
