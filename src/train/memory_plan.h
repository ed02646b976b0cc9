// The memory plan of a training step, from shapes alone (nothing is allocated, no data is read):
// the fast-tier bytes of parameters, gradients, AdamW state, the model's buffers, the saved
// activations under a policy (keep / recompute / swap per tag, memory/save_policies.h) and the
// workspaces of the kernels, followed through the step's events as the activation store applies
// them (docs/architecture.md, "The memory plan": a shape-only dry run of a step gives the plan `--memory-budget` uses):
//   forward of layer l   per sublayer: the kept tensors of layers < l (the swapped ones of l − 1
//                        still writing), l's so far, that sublayer's forward workspace;
//   the loss             every layer's kept tensors, the head's, the loss's chunk of logits;
//   backward of layer l  the kept tensors of layers < l, l's (refilled, read back; not those its
//                        backward forms again, memory/activation_tags.h), and the small
//                        entries (under the paged size) of the head and the layers above, which
//                        the store frees only when the step ends; then per part: a re-run mixer
//                        (the FFN's dropped tensors not yet refilled) with its forward workspace, a
//                        re-run FFN with its, each with the throwaway copies of its kept tensors;
//                        the FFN's backward; the mixer's backward with layer l − 1's prefetch.
// The peak is the largest of these. Each layer kind reports its saved tensors and workspace
// (model/memory_sizes.h), the loss its chunk (ops/cross_entropy.h).
//
// Per rank of a parallel run (parallel/mesh.h, parallel/fsdp.h): the rank's shard of parameters,
// gradients and moments (parallel/shard_layout.h: its expert slices included), the buffers every
// rank keeps whole, and at each event the FSDP units it has gathered (the one in use, the one
// prefetched, the tied embeddings' throughout) and the units whose gradients are written and not
// yet reduce-scattered (the one in its backward, the tied embeddings' from the head on; every
// unit's while micro-batches accumulate). Before the first step every rank holds the whole
// parameters (initialized or loaded, then sharded): the start-up figure; and a whole checkpoint's
// save gathers the whole parameters and both moments on every rank beside its shards: the
// checkpoint figure (--sharded-checkpoints writes the shards instead). With ep > 1 an MoE layer's
// routed rows live in the expert exchange (parallel/expert_parallel.h): the rows this rank's experts
// receive (expert_imbalance times its own) with their weights and, unless the policy leaves them to
// the owners' backward, their activations, from the layer's forward to its FFN backward; the
// exchange's buffers of the moment count as the layer's workspace. With cp > 1 every per-token
// tensor holds the rank's tokens of each sequence, and a sequence mixer's workspace what its
// exchange gathers (model/memory_sizes.h's ContextPlan).
//
// `--memory-budget` tries the policies from the cheapest on (measured on the MoE demo, docs/benchmarks.md:
// keep-all, swap selective, swap full, recompute selective, recompute full, recompute full with the
// layer inputs swapped) and takes the first whose peak fits, or names the smallest budget any of them meets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "memory/activation_store.h"
#include "model/adapter_layout.h"
#include "model/config.h"
#include "model/step.h"
#include "parallel/context_parallel.h"

namespace trillion {

struct MemoryPolicy {
  std::string recompute = "none";
  std::string swap = "none";
  std::string name() const;  // "keep-all", "recompute full", "swap selective", "recompute full + swap attn_input"
};

// Whether a run keeps LoRA's frozen base in bf16 only (Model::keep_frozen_base_in_bf16_only):
// float parameters (`element_bytes` 4) under the bf16 precision (`bf16_products`), on one rank.
bool keeps_bf16_only_base(const ModelConfig& config, int ranks, int64_t element_bytes, bool bf16_products);

struct StepMemoryShape {
  int64_t batch = 0, seq = 0;
  int64_t element_bytes = 4;  // float32 or float64 parameters and compute
  IndexerTraining indexer;    // sparse layers' mode and loss
  LossGradients loss = LossGradients::in_forward;
  int threads = 1;                         // the loss's tiles are per thread
  int64_t policy_min_bytes = ActivationStore::kPagedMinBytes;  // smaller saved tensors are always kept
  bool swap_bf16 = false;                  // swapped float32 tensors stored as bfloat16
  bool bf16_products = false;              // --precision bf16: on one rank, the parameters' bf16 copy;
                                           // on several, FSDP's gathers in bf16;
                                           // on every rank, saved operands in bf16
  int64_t sampler_windows = 0;             // the data sampler's permutation (int64 each; 0: no data yet)
  // The parallel layout: this rank of `ranks` (FSDP over all of them), routed experts over groups
  // of `ep`, each sequence split over groups of `cp` (parallel/mesh.h); `batch` is the rank's rows of
  // a micro-batch (with cp, its group's, of which it holds its tokens: the split's local length of
  // `seq`), `grad_accum` micro-batches a step.
  int ranks = 1, rank = 0, ep = 1, cp = 1;
  int64_t grad_accum = 1;
  // ep > 1: the rows this rank's experts receive per MoE layer, as a multiple of its own routed rows.
  double expert_imbalance = 1.0;
  // ranks > 1: checkpoints are whole (not --sharded-checkpoints), so a save gathers the whole
  // parameters and both moments on every rank.
  bool whole_checkpoints = false;
  ExpertLayout adapter_layout = ExpertLayout::as_trained;  // LoRA: OUT/adapter's routed experts' pairs
  // Whether FSDP gathers in bf16 runs (parallel/fsdp.h).
  bool bf16_gathers() const { return ranks > 1 && bf16_products && element_bytes == 4; }
};

// The layers' view of the step of `shape` on its rank (model/memory_sizes.h's StepShape): with cp > 1
// the rank's tokens of each sequence (its split's local length) and the split's plan.
class LayerStep {
 public:
  explicit LayerStep(const StepMemoryShape& shape);
  LayerStep(const LayerStep&) = delete;
  LayerStep& operator=(const LayerStep&) = delete;
  const StepShape& shape() const { return step_; }

 private:
  std::optional<ContextSplitPlan> context_;
  StepShape step_;
};

struct MemoryPlan {
  MemoryPolicy policy;
  int ranks = 1, rank = 0;
  // Fast tier, bytes. Several ranks: parameters (the rank's shard and the unsharded buffers),
  // gradients and optimizer state are the rank's shard; the units in use are counted apart. One
  // rank under the bf16 precision: parameters include their bf16 copy (model/model_impl.h).
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t gathered_at_peak = 0;    // FSDP: gathered parameters and written gradients of units
  int64_t model_buffers = 0;       // residual stream and its gradient, positions, the recompute copy,
                                   // the sampler's permutation, the bf16 swap's staging buffer
  int64_t activations_saved = 0;   // every tensor the forward saves (before any policy)
  int64_t activations_at_peak = 0;
  int64_t workspace_at_peak = 0;
  int64_t loss_workspace = 0;      // the LM head's loss at its largest (its chunk of logits, forward or backward)
  int64_t peak_fast = 0;
  std::string peak_at;             // "forward of layer 3", "the loss", "backward of layer 0", …
  int64_t start_up = 0;            // before the first step: whole parameters and the shard's state
  int64_t checkpoint_save = 0;     // a whole checkpoint's save on several ranks (0: none, or sharded)
  // Slow tier: the swap file's bytes at most (every swapped tensor of a step).
  int64_t peak_slow = 0;
  // Per layer kind ("linear_attention + moe"), in layer order of first use: its layers, the bytes
  // they save and those the policy keeps in the fast tier until their backward (not swapped, not
  // dropped for recompute): what the activations at the forward's end are made of; and of the
  // saved, the expert exchange's rows (with ep > 1: parallel/expert_parallel.h).
  struct KindActivations {
    std::string kind;
    int layers = 0;
    int64_t saved = 0, kept = 0, exchanged = 0;
  };
  std::vector<KindActivations> activations_by_kind;
  // The FLOPs recompute adds (the step's time, train/step_traffic.h): per token, the forward of each
  // sublayer it re-runs (with ep, an MoE sublayer's without its routed experts); per routed row an
  // MoE layer's experts run, averaged over the MoE layers, the gate/up product their backward forms
  // again when the policy drops it.
  double rerun_flops_per_token = 0.0;
  double rebuild_flops_per_routed_row = 0.0;
  // Whether the policy re-runs a mixer sublayer, which context parallelism does not do yet (the ranks
  // of a group would have to agree on what re-runs): such plans are refused with cp > 1.
  bool reruns_mixers = false;
  // What the rank must hold at once at some point: the step's peak, start-up or a checkpoint's save.
  int64_t largest() const { return std::max({peak_fast, start_up, checkpoint_save}); }
  nlohmann::json to_json() const;
  std::string describe() const;  // a few lines for people
};

MemoryPlan plan_memory(const ModelConfig& config, const StepMemoryShape& shape, const MemoryPolicy& policy);
// The same with the config's parameter table built already (param_table_of: a 2.8 T config's takes
// 0.2 s, and every device of a mesh plans with the same).
MemoryPlan plan_memory(const ModelConfig& config, const ParamTable& table, const StepMemoryShape& shape,
                       const MemoryPolicy& policy);

// The policies `--memory-budget` tries, cheapest first.
std::vector<MemoryPolicy> budget_candidates();
// The first candidate whose peak fits `budget` bytes (with cp > 1, of those that re-run no mixer);
// fails naming the budget, the smallest peak of any candidate (and its policy) otherwise.
MemoryPlan choose_policy(const ModelConfig& config, const ParamTable& table, const StepMemoryShape& shape,
                         int64_t budget);
// Fails, naming the policy and --cp, when `plan` re-runs a mixer under context parallelism.
void require_no_mixer_reruns(const MemoryPlan& plan, int cp);

// "2G", "512M", "1.5GiB", "300000" (suffixes K, M, G, T, powers of 1024, optional "iB" / "B");
// `option` names the flag in errors.
int64_t parse_bytes(const std::string& text, const char* option);

}  // namespace trillion
