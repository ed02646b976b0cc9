// `trillion bench loss`: the LM head + cross-entropy, loss and both gradients, three ways in one
// process: `fused` (lm_head_cross_entropy_forward_backward: gradients formed during the forward,
// 3 gemm passes, one row chunk's logits), `recompute` (lm_head_cross_entropy_forward + backward:
// 4 gemm passes, lowest memory) and `plain` (lm_head_cross_entropy_plain: 3 gemms over stored
// [tokens, vocab] logits).
//
// Reports median times (the paths and the sgemm ceiling timed in rotation, so all see the same load
// on a shared machine), speedup = plain / fused, ratio_recompute = recompute / fused, max_rel_err of
// fused against plain (loss, dh, dw), the fraction of the sgemm rate reached (FLOPs = 3 · 2 · tokens
// · hidden · vocab, recomputation not counted) and peak extra bytes: what the loss allocates beyond
// its inputs, the head weight, dh and dw (all paths have those), with memory_ratio = plain / fused.
// The recompute pair has no z-loss, so its error against plain is reported only when --z-loss is 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <nlohmann/json.hpp>

namespace trillion {

struct LossBenchOptions {
  int64_t tokens = 4096;    // rows of the hidden states
  int64_t hidden = 1024;    // d
  int64_t vocab = 131072;
  double z_loss = 0.0;      // z-loss coefficient of the fused and plain paths
  int runs = 10;            // timed runs of the fused path and of the sgemm ceiling (after one warm-up)
  int baseline_runs = 10;   // timed runs of the recompute and plain paths (after one warm-up)
  // docs/architecture.md ("Benchmarks") asks for the median of at least 10 runs; fewer are for smoke
  // tests only.
  int64_t gemm_size = 2048; // size of the sgemm that measures the ceiling
  std::string precision = "fp32";  // the products' operands (ops/gemm.h): fp32 or bf16
};

// Runs the benchmark; calls emit for each measurement (one JSON object each: sgemm_ceiling, fused,
// under bf16 fused_rounding (the fused path without its dlogits copy, CrossEntropyTiling), recompute,
// plain) and returns the summary: bench_summary's fields plus ratio_recompute, recompute_s,
// recompute_peak_bytes, plain_s, fused_row_chunk, z_loss, precision and the sizes; under bf16 also
// dlogits_copy_speedup (fused_rounding over fused) and dlogits_copy_same_bits.
nlohmann::json run_loss_bench(const LossBenchOptions& options, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
