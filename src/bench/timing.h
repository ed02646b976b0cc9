// Timing helpers for `trillion bench`: wall-clock seconds of a callable, median over runs after
// warm-up, interleaved timing of two callables, the fast tier's peak bytes of a call, and the sgemm
// problem that serves as the machine's compute ceiling.
#pragma once

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "core/rng.h"
#include "ops/gemm.h"

namespace trillion {

struct TimingResult {
  double median_s = 0;
  double min_s = 0;
  int runs = 0;
};

// Median and minimum of measured seconds (at least one).
inline TimingResult summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {median, seconds.front(), static_cast<int>(n)};
}

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
  return summarize(seconds);
}

// Bytes above the current fast-tier level at the peak of fn().
template <class Fn>
int64_t peak_extra_bytes(const Fn& fn) {
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  fn();
  return MemoryStats::peak(Tier::fast) - before;
}

// Times two callables alternately (a, b, a, b, ...) so that both see the same machine load; on a
// shared machine their ratio is then far steadier than either time alone.
template <class FnA, class FnB>
std::pair<TimingResult, TimingResult> time_interleaved(const FnA& fn_a, const FnB& fn_b, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) {
    fn_a();
    fn_b();
  }
  std::vector<double> seconds_a, seconds_b;
  for (int i = 0; i < runs; ++i) {
    seconds_a.push_back(time_median(fn_a, 0, 1).median_s);
    seconds_b.push_back(time_median(fn_b, 0, 1).median_s);
  }
  return {summarize(seconds_a), summarize(seconds_b)};
}

// The summary fields every fused-vs-baseline benchmark reports (docs/architecture.md, "Benchmarks"):
// speedup (baseline / fused median time), max_rel_err, ceiling_fraction (flops per fused second over the
// sgemm ceiling), the times and GFLOP/s, and peak bytes with memory_ratio (baseline / fused).
inline nlohmann::json bench_summary(const char* bench, const TimingResult& fused, const TimingResult& baseline,
                                    double max_rel_err, double flops, double ceiling_gflops, int64_t ceiling_gemm_size,
                                    int64_t fused_peak_bytes, int64_t baseline_peak_bytes) {
  const double fused_gflops = flops / fused.median_s * 1e-9;
  return {{"bench", bench},
          {"speedup", baseline.median_s / fused.median_s},
          {"max_rel_err", max_rel_err},
          {"ceiling_fraction", fused_gflops / ceiling_gflops},
          {"ceiling_gflops", ceiling_gflops},
          {"ceiling_gemm_size", ceiling_gemm_size},
          {"fused_gflops", fused_gflops},
          {"fused_s", fused.median_s},
          {"baseline_s", baseline.median_s},
          {"memory_ratio", double(baseline_peak_bytes) / double(fused_peak_bytes)},
          {"fused_peak_bytes", fused_peak_bytes},
          {"baseline_peak_bytes", baseline_peak_bytes},
          {"flops", flops}};
}

// A single-precision GEMM c[m, n] = a[m, k] · b[k, n] (2·m·n·k FLOPs; size³ by default) with random
// operands, run on the float backend in use (ops/gemm.h) at the matmul precision in use, with the
// process's thread count: the compute ceiling that kernels are measured against. run_bf16() is the
// same product on the operands stored in bf16 (gemm_bf16).
class SgemmProblem {
 public:
  explicit SgemmProblem(int64_t size) : SgemmProblem(size, size, size) {}
  SgemmProblem(int64_t m, int64_t n, int64_t k) : m_(m), n_(n), k_(k), a_(m * k), b_(k * n), c_(m * n) {
    const CounterRng rng(1, "bench_gemm");
    for (int64_t i = 0; i < m * k; ++i) a_[i] = float(rng.uniform(i) - 0.5);
    for (int64_t i = 0; i < k * n; ++i) b_[i] = float(rng.uniform(m * k + i) - 0.5);
  }
  void run() { gemm<float>(false, false, m_, n_, k_, 1.0f, a_.data(), k_, b_.data(), n_, 0.0f, c_.data(), n_); }
  void run_bf16() {
    if (a16_.size() == 0) {  // made at the first bf16 run: the MFU ceiling never needs them
      a16_ = Buffer<bf16>(m_ * k_);
      b16_ = Buffer<bf16>(k_ * n_);
      to_bf16(a_.data(), a16_.data(), m_ * k_);
      to_bf16(b_.data(), b16_.data(), k_ * n_);
    }
    gemm_bf16(false, false, m_, n_, k_, 1.0f, a16_.data(), k_, b16_.data(), n_, 0.0f, c_.data(), n_);
  }
  double flops() const { return 2.0 * double(m_) * double(n_) * double(k_); }
  int64_t size() const { return m_; }
  // Relative error (max|c − ref| / max|ref|) of the last run on up to 64 sampled entries of c
  // against double-precision dot products of the float operands, or of their bf16 roundings.
  double sampled_rel_err(bool bf16_operands = false) const {
    const auto a = [&](int64_t i) { return double(bf16_operands ? round_to_bf16(a_[i]) : a_[i]); };
    const auto b = [&](int64_t i) { return double(bf16_operands ? round_to_bf16(b_[i]) : b_[i]); };
    const int64_t samples = m_ * n_ < 64 ? m_ * n_ : 64;
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t i = (s * 7919) % m_, j = (s * 104729 + s / m_) % n_;
      double ref = 0.0;
      for (int64_t p = 0; p < k_; ++p) ref += a(i * k_ + p) * b(p * n_ + j);
      max_diff = std::max(max_diff, std::abs(double(c_[i * n_ + j]) - ref));
      max_ref = std::max(max_ref, std::abs(ref));
    }
    return max_diff / std::max(max_ref, 1e-30);
  }

 private:
  int64_t m_, n_, k_;
  Buffer<float> a_, b_, c_;  // [m, k], [k, n], [m, n]
  Buffer<bf16> a16_, b16_;   // [m, k], [k, n]: a and b rounded to bf16 (empty until run_bf16)
};

// The MFU ceiling: the rate (FLOP/s) of `trillion bench gemm`'s problem, a float32 sgemm of size³
// (2048 by default), median of 5 timed runs after one warm-up, at this process's thread count.
inline double measure_sgemm_rate(int64_t size) {
  SgemmProblem problem(size);
  const TimingResult timing = time_median([&] { problem.run(); }, /*warmup=*/1, /*runs=*/5);
  return problem.flops() / std::max(timing.median_s, 1e-9);
}

}  // namespace trillion
