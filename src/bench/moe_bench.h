// `trillion bench moe`: forward plus backward of a whole routed-MoE layer chain — router (logits =
// x · W_routerᵀ, softmax scores, top-k, renormalized weights), plan, experts — with the fused
// experts (ops/moe_experts.h) against the fragmented baseline (ops/ref/moe_ref.h), in one process.
// Both chains run the same router code; only the expert part differs. Router weights are random
// from a fixed seed (not balanced by construction), so expert loads are uneven; dropless.
//
// Reports time (median), speed relative to the baseline, accuracy against it (output and every
// gradient: dx, dW_router, dgate_up, ddown, and the routing-weight gradient), the fraction of the
// machine's sgemm rate reached (FLOPs = 18 · T · k · H · I for the expert GEMMs, forward and
// backward; the router's FLOPs are not counted, over the sgemm rate at gemm_size³ measured in the
// same process; the sgemm, fused and fragmented runs alternate so that all three see the same load),
// the median time of each phase, expert loads and peak memory of each chain
// (MemoryStats, fast tier: inputs, outputs, saved tensors and workspaces).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

namespace trillion {

struct MoeBenchOptions {
  int64_t tokens = 4096;       // T
  int64_t hidden = 512;        // H
  int64_t experts = 64;        // E
  int64_t top_k = 8;           // k
  int64_t expert_width = 256;  // I (moe_intermediate_size)
  int runs = 10;               // timed runs of the fused chain (after one warm-up), and of the sgemm
  int baseline_runs = 10;      // timed runs of the fragmented chain (after one warm-up)
  // docs/architecture.md ("Benchmarks") asks for the median of at least 10 runs; fewer are for smoke
  // tests only.
  int64_t gemm_size = 2048;  // size of the sgemm that measures the ceiling
  uint64_t seed = 1;         // inputs, router and expert weights
};

// Runs the benchmark; calls emit for each measurement (one JSON object each) and returns the summary:
// bench, speedup, max_rel_err, ceiling_fraction, ceiling_gflops, fused_gflops, memory_ratio, sizes,
// tokens_per_expert_max / _mean.
nlohmann::json run_moe_bench(const MoeBenchOptions& options, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
