// `trillion bench context-parallel` (under mpirun -np cp; one process is cp 1): a sequence mixer's
// forward and backward over long sequences split over the ranks, against the plain kernels over the
// whole sequences on one rank. Mixers: attention (parallel/context_parallel.h, GQA), sparse (GQA
// over the lightning indexer's top-k: ops/indexer.h with --index-heads, --index-dim, --topk, and
// ops/sparse_attention.h), mla (MLA's attention between its projections in the absorbed form over
// the gathered latent rows, against one rank's expanded form: bench/context_parallel_mla.cpp;
// --heads, --head-dim, --rope-dim, --v-dim and --latent-dim are its H, qk_nope, qk_rope and v head
// dims and kv_lora_rank, --adapter-rank a LoRA adapter on kv_b_proj), sparse_mla (MLA over the
// indexer's top-k, DeepSeek-V3.2's and the Kimi-K3-like hybrid's sparse layers), the gated delta rule with
// per-head (gated_deltanet) or per-key-channel (kda) decay (parallel/context_delta_rule.h; --heads,
// --head-dim and --v-dim are its H, K and V) and the short convolution (conv:
// parallel/context_conv1d.h; heads · head dim channels, --conv-width taps).
//
// Every rank draws the same whole inputs (document masks of --doc-len tokens, their starts shifted
// per sequence so documents cross the ranks' chunks), takes its tokens' rows, and runs the split
// forward + backward --runs times. It also runs the plain kernels over the whole sequences (timed
// alternately on one rank, untimed otherwise) and compares: max_rel_err = max over every output and
// gradient and the ranks of max|cp − one rank| / max|one rank|.
//
// Reports the slowest rank's median seconds of forward + backward; per rank the peak bytes (the local
// tensors, inputs, outputs and gradients, plus the kernels' temporaries at their peak) against one
// rank's for the whole sequences (peak_ratio, the largest over the ranks); and the bytes each rank
// received, forward and backward, as the collectives' counts give them, against the mixer's formula
// (context_attention_traffic, with the indexer's keys for sparse; context_gathered_rows_traffic of
// the absorbed rows for mla, and the indexer's keys for sparse_mla; context_delta_rule_traffic, context_conv1d_traffic;
// traffic_matches_plan: equal on every rank).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trillion {

struct ContextParallelBenchOptions {
  std::string mixer = "attention";  // attention, sparse, mla, sparse_mla, gated_deltanet, kda or conv
  int64_t seq_len = 16384;
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  int64_t v_dim = 0;    // 0: head_dim
  int64_t doc_len = 0;  // tokens per packed document (document masks); 0: none
  int64_t conv_width = 4;  // conv: the kernel's taps
  int64_t index_heads = 4;  // sparse, sparse_mla: the indexer's H_I, d_I and top-k
  int64_t index_dim = 32;
  int64_t topk = 256;
  // mla, sparse_mla: qk_rope_head_dim (--head-dim is qk_nope_head_dim, --v-dim v_head_dim),
  // kv_lora_rank, and a LoRA adapter's rank on kv_b_proj (0: none)
  int64_t rope_dim = 32;
  int64_t latent_dim = 128;
  int64_t adapter_rank = 0;
  bool use_double = false;
  int runs = 3;
  uint64_t seed = 1;
};

// Every rank calls it; the summary is complete on every rank.
nlohmann::json run_context_parallel_bench(const ContextParallelBenchOptions& options);

}  // namespace trillion
