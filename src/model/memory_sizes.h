// What the memory plan asks of each layer kind, from shapes alone (no data, nothing allocated):
//   saved_tensors(dims, extent)   the tensors one training forward of the kind saves in the
//                                 activation store (model/saved_tensors.h; the plan's extent
//                                 sizes MoE's routed rows at their bound, N · k);
//   workspace_bytes(dims, shape)  the most fast-tier bytes the kind's training forward, and its
//                                 backward, holds at once beyond what it saves: the layer's
//                                 scratch arena (each
//                                 allocation rounded up to 64 bytes, as the Arena does) and the
//                                 temporaries its kernels allocate (Buffers, per thread where they
//                                 are per thread; each kernel states its own next to its code).
// Each kind defines both next to its forward and backward; tests/model/memory_sizes_test.cpp holds
// them to the real store and scratch arena for every layer kind.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "memory/activation_tags.h"
#include "model/saved_tensors.h"
#include "model/step.h"

namespace trillion {

// A kind's workspace in each pass of a training step.
struct Workspace {
  int64_t forward = 0, backward = 0;
};

// Bytes a rank received from the other ranks of its context-parallel group: the others' rows it
// gathered, and the other ranks' partial sums of its own rows.
struct ContextTraffic {
  int64_t gathered_bytes = 0;
  int64_t reduced_bytes = 0;
  int64_t total() const { return gathered_bytes + reduced_bytes; }
  ContextTraffic& operator+=(const ContextTraffic& o) {
    gathered_bytes += o.gathered_bytes;
    reduced_bytes += o.reduced_bytes;
    return *this;
  }
};

// What one forward and its backward receive.
struct ContextPassTraffic {
  ContextTraffic forward, backward;
  ContextTraffic both() const {
    ContextTraffic sum = forward;
    return sum += backward;
  }
};

// What one of the exchange's calls costs a rank in a training step (its forward and its backward):
// what it holds at its peak beyond its arguments and results, and what it receives.
struct ContextCost {
  Workspace workspace;
  ContextTraffic received;
};

// Context parallelism's part of the plan (parallel/context_parallel.h implements it for a rank of
// a split), per call of the exchange with the local sizes the layer hands it (this rank's tokens
// per sequence; no packed segments).
class ContextPlan {
 public:
  virtual ~ContextPlan() = default;
  virtual int64_t sequence_length() const = 0;  // the whole sequences'
  // This rank's two chunks of each sequence (as ContextExchange::chunks gives them).
  virtual std::array<ContextChunk, 2> chunks() const = 0;
  // Attention chunk by chunk over keys and values the layer gathered (local.kv_len: the whole
  // sequences'; ContextExchange::gathered_attention_forward / _backward): dense (topk 0), or over
  // topk selected keys per query (ops/sparse_attention.h, its rows read as bf16 when bf16_rows).
  virtual Workspace gathered_attention(const AttentionSizes& local, int64_t topk, bool bf16_rows, int threads,
                                       int64_t element_bytes) const = 0;
  // What a layer's own gather of `row` values per token receives: gather_sequences in the forward;
  // in the backward, the gather again and reduce_sequences of their gradients.
  virtual ContextPassTraffic gathered_rows(int64_t batch, int64_t row, int64_t element_bytes) const = 0;
  // The short convolution with its halos (parallel/context_conv1d.h).
  virtual ContextCost conv1d_silu(const Conv1dSizes& local, int64_t element_bytes) const = 0;
  // The gated delta rule by state passing (parallel/context_delta_rule.h), without document masks:
  // each document starting inside a chunk adds a segment's states.
  virtual ContextCost delta_rule(const DeltaRuleSizes& local, int threads, int64_t element_bytes) const = 0;
};

struct StepShape {
  int64_t batch = 0, seq = 0;  // with context: seq is this rank's tokens of each sequence
  int64_t element_bytes = 4;  // sizeof(T): 4 for float, 8 for double
  int threads = 1;            // OpenMP threads: kernels keep per-thread workspaces
  IndexerTraining indexer;    // sparse layers' mode and loss (coef > 0: the indexer loss is on)
  bool experts_exchanged = false;  // ep > 1: MoE layers' routed rows run on their experts' owners
  double expert_imbalance = 1.0;   // … which receive at most this times a rank's own routed rows
  bool bf16_operands = false;      // the store keeps declared operands as bf16 (saved_as_bf16)
  const ContextPlan* context = nullptr;  // context parallelism (null: whole sequences)
  int64_t tokens() const { return batch * seq; }
  // The saved tensors' extent of a training step of this shape (MoE's routed rows at their bound).
  SavedExtent extent() const {
    return {.batch = batch,
            .seq = seq,
            .indexer_loss = indexer.coef > 0.0,
            .indexer_sparse = indexer.mode == IndexerMode::sparse,
            .experts_exchanged = experts_exchanged,
            .sequence_split = context != nullptr,
            .received_imbalance = expert_imbalance};
  }
};

}  // namespace trillion
