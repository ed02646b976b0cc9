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

struct StepShape {
  int64_t batch = 0, seq = 0;
  int64_t element_bytes = 4;  // sizeof(T): 4 for float, 8 for double
  int threads = 1;            // OpenMP threads: kernels keep per-thread workspaces
  IndexerTraining indexer;    // sparse layers' mode and loss (coef > 0: the indexer loss is on)
  bool experts_exchanged = false;  // ep > 1: MoE layers' routed rows run on their experts' owners
  double expert_imbalance = 1.0;   // … which receive at most this times a rank's own routed rows
  bool bf16_operands = false;      // the store keeps declared operands as bf16 (saved_as_bf16)
  int64_t tokens() const { return batch * seq; }
  // The saved tensors' extent of a training step of this shape (MoE's routed rows at their bound).
  SavedExtent extent() const {
    return {.batch = batch,
            .seq = seq,
            .indexer_loss = indexer.coef > 0.0,
            .indexer_sparse = indexer.mode == IndexerMode::sparse,
            .experts_exchanged = experts_exchanged,
            .received_imbalance = expert_imbalance};
  }
};

}  // namespace trillion
