// The FMA and bf16 dot-product throughput loops (see physical_peak.h). Hand-written because no
// library measures an instruction's throughput: each loop keeps more independent accumulators
// than latency × pipes (Zen 2: 5 × 2, Zen 4/5 and Intel: 4 × 2), in registers (the chain loop is
// unrolled whole: left to itself, gcc 12 keeps 24 accumulators on the stack and times loads and
// stores, 0.65 of Zen 4's FMA rate), with values that stay normal (a · 0.999999 + 1e-6 converges to
// 1), and returns their sum so nothing is elided.
#include "bench/physical_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/parallel.h"

namespace trillion {
namespace {

constexpr int kAvx2Chains = 12;     // of 16 ymm registers (2 hold the operands)
constexpr int kAvx512Chains = 24;   // of 32 zmm registers

__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iterations) {
  __m256 acc[kAvx2Chains];
  for (int c = 0; c < kAvx2Chains; ++c) acc[c] = _mm256_set1_ps(float(c));
  const __m256 scale = _mm256_set1_ps(0.999999f), shift = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 32
    for (int c = 0; c < kAvx2Chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], scale, shift);
  __m256 sum = acc[0];
  for (int c = 1; c < kAvx2Chains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}

__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iterations) {
  __m512 acc[kAvx512Chains];
  for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_set1_ps(float(c));
  const __m512 scale = _mm512_set1_ps(0.999999f), shift = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 32
    for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], scale, shift);
  __m512 sum = acc[0];
  for (int c = 1; c < kAvx512Chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

// acc += Σ pairs of a · b: 32 bf16 products per instruction. a · b is small (2⁻¹⁰ per pair) so the
// accumulators grow slowly and stay exact enough not to matter.
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(int64_t iterations) {
  __m512 acc[kAvx512Chains];
  for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_set1_ps(float(c));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a80);  // bf16 0.0009765625 = 2⁻¹⁰
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 32
    for (int c = 0; c < kAvx512Chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kAvx512Chains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

// Instructions per second per thread of a loop of `chains` independent instructions per
// iteration, every thread running it at once: the loop is lengthened until a run takes `seconds`,
// then the best of 5 runs counts.
template <class Loop>
double instructions_per_second(const Loop& loop, int chains, double seconds) {
  std::vector<float> results(size_t(num_threads()), 0.0f);  // [threads]: keeps the loops' work alive
  const auto timed_run = [&](int64_t iterations) {
    const auto start = std::chrono::steady_clock::now();
    parallel_region([&] { results[size_t(omp_get_thread_num())] = loop(iterations); });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t iterations = int64_t(1) << 14;
  while (timed_run(iterations) < seconds) iterations *= 2;
  double best = 0.0;
  for (int run = 0; run < 5; ++run) best = std::max(best, double(iterations) * chains / timed_run(iterations));
  volatile float sink = 0.0f;
  for (const float r : results) sink = sink + r;
  return best;
}

}  // namespace

PhysicalPeak measure_physical_peak(double seconds) {
  PhysicalPeak peak;
  peak.threads = num_threads();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  peak.fma_isa = avx512 ? "avx512" : "avx2";
  peak.fp32_lanes = avx512 ? 16 : 8;
  peak.fma_per_s = avx512 ? instructions_per_second(fma_chains_avx512, kAvx512Chains, seconds)
                          : instructions_per_second(fma_chains_avx2, kAvx2Chains, seconds);
  peak.bf16_dot = avx512 && __builtin_cpu_supports("avx512bf16");
  if (peak.bf16_dot) peak.bf16_dot_per_s = instructions_per_second(bf16_dot_chains, kAvx512Chains, seconds);
  return peak;
}

std::string PhysicalPeak::formula(MatmulPrecision precision) const {
  char text[200];
  if (precision == MatmulPrecision::bf16 && bf16_dot) {
    std::snprintf(text, sizeof text, "%d threads × 32 bf16 products × 2 FLOP × %.2f G vdpbf16ps/s = %.1f GFLOP/s",
                  threads, bf16_dot_per_s * 1e-9, bf16_flops() * 1e-9);
  } else {
    std::snprintf(text, sizeof text, "%d threads × %d fp32 lanes × 2 FLOP × %.2f G FMA/s (%s)%s = %.1f GFLOP/s",
                  threads, fp32_lanes, fma_per_s * 1e-9, fma_isa,
                  precision == MatmulPrecision::bf16 ? ", no bf16 dot product: float FMAs" : "", fp32_flops() * 1e-9);
  }
  return text;
}

}  // namespace trillion
