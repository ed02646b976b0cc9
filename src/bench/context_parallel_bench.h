// `trillion bench context-parallel` (under mpirun -np cp; one process is cp 1): attention's forward
// and backward over one long sequence split over the ranks (parallel/context_parallel.h), against
// the whole sequence's attention on one rank.
//
// Every rank draws the same whole inputs (q, k, v, dout; document masks of --doc-len tokens, their
// starts shifted per sequence so documents cross the ranks' chunks), takes its tokens' rows, and runs
// context_attention_forward + _backward --runs times. It also runs ops/attention.h over the whole
// sequences, untimed, and compares: max_rel_err = max over out, lse, dq, dk, dv and the ranks of
// max|cp − one rank| / max|one rank|.
//
// Reports the slowest rank's median seconds of forward + backward; per rank the peak bytes (the local
// tensors, inputs, outputs and gradients, plus the kernels' temporaries at their peak) against one
// rank's for the whole sequence (peak_ratio, the largest over the ranks); and the bytes each rank
// received, forward and backward, against context_attention_traffic's formula (traffic_matches_plan:
// equal on every rank).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trillion {

struct ContextParallelBenchOptions {
  std::string mixer = "attention";  // attention, gated_deltanet or kda
  int64_t seq_len = 16384;
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  int64_t v_dim = 0;    // 0: head_dim
  int64_t doc_len = 0;  // tokens per packed document (document masks); 0: none
  bool use_double = false;
  int runs = 3;
  uint64_t seed = 1;
};

// Every rank calls it; the summary is complete on every rank.
nlohmann::json run_context_parallel_bench(const ContextParallelBenchOptions& options);

}  // namespace trillion
