// The distributed step's gradient against one process's, for `trillion gradcheck` under mpirun:
// the same model, weights and batch (model/gradient_check.h's), trained once in this process on the
// whole batch and once as the training run does it (FSDP over the world, the routed experts over
// ep groups, every rank its rows of the batch, and with cp > 1 each context-parallel group its
// rows, each rank its part of every sequence; statistics over the ranks); the gathered sharded
// gradient is compared with the one-process gradient tensor by tensor, and the step's loss terms
// (the LM loss summed over the ranks; the auxiliary terms and each indexer layer's selected mass as
// the statistics reduction gives them) as checks named "loss.…" and "indexer.…", and the LM loss of
// an evaluation pass (forward_loss) after it, "eval.lm_loss_sum". Every rank calls it.
#pragma once

#include <vector>

#include "model/config.h"
#include "model/gradient_check.h"
#include "parallel/process_group.h"

namespace trillion {

// Fails (trillion::Error) when the batch does not split over the ranks, the experts over ep, or
// the sequence over cp.
std::vector<TensorCheck> check_distributed_gradients(const ModelConfig& config, const GradientCheckOptions& options,
                                                     const ProcessGroup& world, int ep, int cp = 1);

}  // namespace trillion
