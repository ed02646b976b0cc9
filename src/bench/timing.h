// Timing helpers for `trillion bench`: wall-clock seconds of a callable, median over runs after
// warm-up, and the sgemm rate that serves as the machine's compute ceiling.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace trillion {

struct TimingResult {
  double median_s = 0;
  double min_s = 0;
  int runs = 0;
};

// Runs fn warmup times untimed, then runs times, and returns the median and minimum wall time.
template <class Fn>
TimingResult time_median(const Fn& fn, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {median, seconds.front(), runs};
}

// Single-precision GEMM rate at size³ with the process's thread count: GFLOP/s from the median of
// runs timed calls after two warm-up calls (2·size³ FLOPs each).
struct GemmRate {
  int64_t size = 0;
  double gflops = 0;
  TimingResult timing;
};
GemmRate measure_sgemm_rate(int64_t size, int runs);

}  // namespace trillion
