// The CPU's physical peak, measured: every thread runs independent chains of vector FMAs (fp32) or
// of bf16 dot-product instructions (vdpbf16ps, AVX512-BF16) for a few milliseconds, enough chains
// to cover the instruction's latency on every pipe, so the rate is pipes × clock × lanes × 2 FLOP
// at the clock the cores hold under that load. It is the ceiling no kernel passes; MFU against it
// says how far a step is from the machine, and MFU against the measured GEMM rate (bench/timing.h)
// how far from the library. The VM reports no clock, so the formula states the measured
// instruction rate per thread rather than pipes and GHz.
//
// bf16: where the CPU has no bf16 dot product, bf16 products run on float FMAs (ops/gemm.h widens
// them), so the bf16 peak is the fp32 peak.
#pragma once

#include <string>

#include "ops/gemm.h"

namespace trillion {

struct PhysicalPeak {
  int threads = 0;
  const char* fma_isa = "";        // "avx512" or "avx2": the widest FMA the CPU has
  int fp32_lanes = 0;              // 16 or 8
  double fma_per_s = 0.0;          // vector FMA instructions per second, per thread
  bool bf16_dot = false;           // the CPU has vdpbf16ps
  double bf16_dot_per_s = 0.0;     // vdpbf16ps per second, per thread (each 32 products: 64 FLOP)
  double fp32_flops() const { return threads * fma_per_s * fp32_lanes * 2.0; }
  double bf16_flops() const { return bf16_dot ? threads * bf16_dot_per_s * 64.0 : fp32_flops(); }
  double flops(MatmulPrecision precision) const {
    return precision == MatmulPrecision::bf16 ? bf16_flops() : fp32_flops();
  }
  // "2 threads × 8 fp32 lanes × 2 FLOP × 6.20 G FMA/s (avx2) = 198.4 GFLOP/s"
  std::string formula(MatmulPrecision precision) const;
};

// Measures with the process's thread count: runs of about `seconds` each, the best of 5.
PhysicalPeak measure_physical_peak(double seconds = 0.01);

}  // namespace trillion
