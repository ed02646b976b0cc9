// `trillion bench linear-attention`: forward plus backward of the gated delta rule in chunked form
// (delta_rule_chunk_forward + delta_rule_chunk_backward, ops/delta_rule.h) against the recurrent
// form (delta_rule_recurrent_forward + _backward, the baseline), in one process, batch 1, one
// segment, s0 and ds_final null. Inputs are random from a fixed seed: q and k rows L2-normalized and
// q scaled by K^−½ (as the caller of the kernels does), v and d_o normal, g in [−0.5, −0.01] per head
// or per key channel, β in (0.1, 0.9).
//
// For each decay kind requested, reports time (median, and of the forward and the backward alone),
// speed relative to the recurrent form (speedup = recurrent / chunked), accuracy against it (o and
// every gradient: dq, dk, dv, dg, dbeta), the fraction of the machine's sgemm rate reached (FLOPs =
// 3 · T · H · (2 · C · (3K + 2V) + 6 · K · V), C = kDeltaRuleChunk: the chunk's products, forward
// and backward, recomputation not counted, over the sgemm rate at gemm_size³ measured in the same
// process; the sgemm, chunked and recurrent runs alternate so that all three see the same load),
// and peak memory of each (MemoryStats, fast tier: inputs, outputs and workspaces). For each decay
// kind it also times the plain unfused chunked composition (delta_rule_chunk_ref_forward +
// _backward, ops/ref/delta_rule_chunk_ref.h; baseline_runs runs, alternating with the others) and
// reports unfused_s, ratio_unfused = unfused time / fused chunked time, its phases, peak bytes and
// its error against the fused chunked kernel (unfused_max_rel_err, folded into max_rel_err).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <nlohmann/json.hpp>

#include "ops/delta_rule.h"

namespace trillion {

struct LinearAttentionBenchOptions {
  int64_t tokens = 4096;    // T
  int64_t heads = 8;        // H, value heads (key heads already repeated to them)
  int64_t key_dim = 128;    // K
  int64_t value_dim = 128;  // V
  std::string decay = "both";  // per_head, per_key_channel or both
  int runs = 10;               // timed runs of the chunked kernel (after one warm-up), and of the sgemm
  int baseline_runs = 10;      // timed runs of the recurrent kernel and (per head) the unfused one (after one warm-up)
  // docs/architecture.md ("Benchmarks") asks for the median of at least 10 runs; fewer are for smoke
  // tests only.
  int64_t gemm_size = 2048;  // size of the sgemm that measures the ceiling
  uint64_t seed = 1;         // inputs
};

// FLOPs counted for one forward + backward: 3 · T · H · (2 · C · (3K + 2V) + 6 · K · V).
double linear_attention_bench_flops(int64_t tokens, int64_t heads, int64_t key_dim, int64_t value_dim);

// Runs the benchmark; calls emit for each measurement and for each decay kind's summary (one JSON
// object each: bench, decay, speedup, max_rel_err, ceiling_fraction, ceiling_gflops, fused_gflops,
// memory_ratio, sizes) and returns the last line: with one decay kind its summary (emitted no
// second time), with both the combined summary (speedup of per_head, max_rel_err the largest,
// ceiling_fraction and memory_ratio the smallest over the kinds, and each kind's fields under its
// name; unfused_s and ratio_unfused of per_head when per_head ran, ratio_unfused_per_key_channel).
nlohmann::json run_linear_attention_bench(const LinearAttentionBenchOptions& options,
                                          const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
