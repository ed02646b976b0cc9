// `trillion bench sparse-attention`: DeepSeek-V3.2 sparse attention (DSA) for training, forward
// plus backward, against the engine's tiled dense causal attention on the same q/k/v shape, in one
// process, with random inputs from a fixed seed (ops/indexer.h, ops/sparse_attention.h,
// ops/attention.h).
//
// Paths timed (median of `runs`, after one warm-up run of each path; sgemm, sparse and dense
// alternate so that all three see the same load on a shared machine):
//   sparse: indexer_topk + sparse_attention_forward + sparse_attention_backward (the fused path),
//           with the median of each phase;
//   dense:  attention_forward + attention_backward (the baseline: speedup = dense / sparse);
//   plain:  the same work from separate plain steps: the full indexer score matrix and a full sort
//           per row (indexer_ref_topk), then the masked dense attention over the gathered selection
//           (sparse_attention_ref_forward + _backward), [T, T] matrices throughout; run
//           baseline_runs times after its first (untimed) run; ratio_plain = plain / sparse;
//   indexer_loss: indexer_loss (forward + backward in one call) in dense warm-up mode, its target
//           the dense attention's lse, and in sparse mode, its target the sparse attention's lse;
//   mla:    the sparse and dense paths again with MLA's shapes (qk 192, v 128, kv_heads = heads =
//           mla_heads), with their own speedup (mla_speedup); under bf16 also the sparse path with
//           float operands, alternating with the others (mla_bf16_gain = its time / bf16's).
// max_rel_err: the fused path against the plain one (out, lse, dq, dk, dv; the relative error per
// tensor of docs/architecture.md, "Relative error"); topk_mismatch_rows counts rows whose selected
// key sets differ (the two score the keys with different float summation orders, so a near tie at
// rank topk may fall either way).
// When some differ, the attention tensors are compared with one extra untimed plain attention over
// the fused path's selection, so that max_rel_err measures the kernels and not the tie.
//
// FLOPs (recomputation not counted), N = Σ_t min(topk, t + 1) selected (query, key) pairs per
// sequence, V = Σ_t (t + 1) = T(T + 1)/2 visible pairs:
//   sparse = batch · (2 · V · H_I · d_I  +  3 · 2 · N · H · (qk + v))
//            (indexer scores; sparse attention forward q·k and P·v, backward twice that)
//   dense  = batch · 3 · 2 · V · H · (qk + v)
// ceiling_fraction = sparse FLOPs / sparse median time / sgemm rate at gemm_size³.
// Peak bytes (MemoryStats, fast tier): each path's inputs, outputs and workspace.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace trillion {

struct SparseAttentionBenchOptions {
  int64_t seq_len = 8192;       // T (q_len = kv_len, training shape)
  int64_t batch = 1;
  int64_t heads = 8;            // query heads H
  int64_t kv_heads = 2;         // key/value heads
  int64_t head_dim = 64;        // query/key head dim qk
  int64_t v_dim = 0;            // value head dim v; 0 means head_dim
  int64_t index_heads = 4;      // H_I
  int64_t index_head_dim = 64;  // d_I
  int64_t topk = 512;
  int64_t mla_heads = 8;        // heads = kv_heads of the MLA-shaped line (qk 192, v 128); 0 skips it
  int runs = 10;                // timed runs of sparse, dense, sgemm, indexer loss and MLA (after one warm-up)
  int baseline_runs = 2;        // timed runs of the plain path (after its first run)
  // docs/architecture.md ("Benchmarks") asks for the median of at least 10 runs; fewer are for smoke
  // tests only.
  int64_t gemm_size = 2048;     // size of the sgemm that measures the ceiling
  uint64_t seed = 1;            // inputs
  // The operands of the timed paths' products (ops/gemm.h): fp32, or bf16 (the sparse kernels' rows
  // and the dense tiles' GEMM operands, and the ceiling's sgemm, in bf16). The plain path, the
  // reference of max_rel_err, is always float.
  std::string precision = "fp32";
};

// FLOPs of the sparse path and of the dense path by the formulas above.
double sparse_attention_bench_sparse_flops(const SparseAttentionBenchOptions& options, int64_t qk_dim, int64_t v_dim,
                                           int64_t heads);
double sparse_attention_bench_dense_flops(const SparseAttentionBenchOptions& options, int64_t qk_dim, int64_t v_dim,
                                          int64_t heads);

// Runs the benchmark; calls emit for each measurement (one JSON object each) and returns the
// summary: bench_summary's fields (bench, speedup, max_rel_err, ceiling_fraction, ceiling_gflops,
// memory_ratio, ...) plus ratio_plain, plain_s, topk_mismatch_rows, indexer_loss_dense_s,
// indexer_loss_sparse_s, mla_speedup (when the MLA line ran), the sparse phases, the precision and
// the sizes.
nlohmann::json run_sparse_attention_bench(const SparseAttentionBenchOptions& options,
                                          const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
