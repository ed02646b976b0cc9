// `trillion bench attention`: the tiled causal GQA attention kernel (ops/attention.h), forward
// plus backward, against the plain reference (ops/ref/attention_ref.h) in the same process.
//
// Reports time (median), speed relative to the reference, accuracy against it, the fraction of the
// machine's sgemm rate reached (FLOPs = 3 · 4 · T(T+1)/2 · H · d · batch, recomputation not
// counted, over the sgemm rate at gemm_size³ measured in the same process), and peak memory of
// each (MemoryStats, fast tier: inputs, outputs and workspaces).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

namespace trillion {

struct AttentionBenchOptions {
  int64_t seq_len = 4096;   // q_len = kv_len (training shape)
  int64_t heads = 8;        // query heads
  int64_t kv_heads = 2;     // key/value heads
  int64_t head_dim = 64;
  int64_t batch = 1;
  int runs = 10;            // timed runs of the tiled kernel (after one warm-up)
  int baseline_runs = 10;   // timed runs of the reference (after one warm-up)
  // docs/architecture.md ("Benchmarks") asks for the median of at least 10 runs; fewer are for smoke
  // tests only.
  int64_t gemm_size = 2048; // size of the sgemm that measures the ceiling
};

// Runs the benchmark; calls emit for each measurement (one JSON object each) and returns the summary:
// bench, speedup, max_rel_err, ceiling_fraction, ceiling_gflops, fused_gflops, memory_ratio, sizes.
nlohmann::json run_attention_bench(const AttentionBenchOptions& options,
                                   const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
