// The physical peak's measurement (bench/physical_peak.h) at a tiny duration: results, not time.
// The instruction set and lanes are the CPU's widest; the rates are positive and the FLOP/s follow
// from them by the printed formula; bf16 falls back to the fp32 peak without a bf16 dot product.
#include "bench/physical_peak.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/parallel.h"

namespace trillion {
namespace {

TEST(PhysicalPeak, RatesArePositiveAndTheFormulaStatesThem) {
  const PhysicalPeak peak = measure_physical_peak(/*seconds=*/0.001);
  EXPECT_EQ(peak.threads, num_threads());
  const bool avx512 = __builtin_cpu_supports("avx512f");
  EXPECT_EQ(std::string(peak.fma_isa), avx512 ? "avx512" : "avx2");
  EXPECT_EQ(peak.fp32_lanes, avx512 ? 16 : 8);
  EXPECT_GT(peak.fma_per_s, 0.0);
  EXPECT_DOUBLE_EQ(peak.fp32_flops(), peak.threads * peak.fma_per_s * peak.fp32_lanes * 2.0);
  EXPECT_EQ(peak.bf16_dot, avx512 && __builtin_cpu_supports("avx512bf16"));
  if (peak.bf16_dot) {
    EXPECT_GT(peak.bf16_dot_per_s, 0.0);
    EXPECT_DOUBLE_EQ(peak.bf16_flops(), peak.threads * peak.bf16_dot_per_s * 64.0);
  } else {
    EXPECT_EQ(peak.bf16_flops(), peak.fp32_flops());
    EXPECT_NE(peak.formula(MatmulPrecision::bf16).find("no bf16 dot product"), std::string::npos);
  }
  for (const MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
    char total[64];
    std::snprintf(total, sizeof total, "= %.1f GFLOP/s", peak.flops(precision) * 1e-9);
    const std::string formula = peak.formula(precision);
    EXPECT_TRUE(formula.ends_with(total)) << formula;
    EXPECT_EQ(formula.rfind(std::to_string(peak.threads) + " threads × ", 0), 0u) << formula;
  }
}

}  // namespace
}  // namespace trillion
