// What one forward (and backward) of the model reports and takes, beyond the activations:
//   LossScales   how each loss term is normalized across the micro-batches of an optimizer step;
//   StepResult   the named loss terms and per-MoE-layer statistics the trainer writes to metrics;
//   DecisionLog  the discrete decisions taken in forward (routing, sparse attention's selection),
//                recorded once and replayed by gradcheck's perturbed passes and by recomputation,
//                so finite differences never flip a decision and recompute never re-routes;
//   UnitHooks    called before and after each FSDP unit's forward and backward (identity on one
//                rank; FSDP's gather/free plug in here);
//   StatisticsReduction  how a training forward's routing statistics and loss values become those
//                of the whole data-parallel batch (one share: as they are);
//   ExpertExchange  expert parallelism: where an MoE layer's routed experts run (null: here);
//   ContextExchange context parallelism: this rank holds part of every sequence (null: all of it);
//   LayerPass    what the layer loops hand every layer kind in forward and backward.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/attention.h"
#include "ops/conv1d.h"
#include "ops/cross_entropy.h"
#include "ops/delta_rule.h"
#include "ops/moe_experts.h"

namespace trillion {

// The step's objective is lm · Σ CE over counted targets + Σ_terms coef · aux · value, with
//   lm  = 1 / (counted targets of the whole optimizer step: all micro-batches), and
//   aux = 1 / (micro-batches of the step): router losses are per micro-batch values (as
//         transformers computes them per forward) averaged over the step's micro-batches.
struct LossScales {
  double lm = 1.0;
  double aux = 1.0;
};

// How the LM head + cross-entropy forms its gradients in training (the scale is known up front):
//   in_forward  chunk by chunk during the forward, keeping each chunk's logits between the loss and
//               its gradients (3 GEMM passes; the default; saves dh [N, D]);
//   recompute   the forward keeps only lse [N] and the backward recomputes every logits tile
//               (4 GEMM passes; the lowest memory).
enum class LossGradients { in_forward, recompute };

// One auxiliary loss term of a forward: its value (before the coefficient) and how it is formed.
struct LossTerm {
  std::string name;           // "aux_loss", "router_z_loss"
  double value = 0.0;         // this micro-batch's value
  double coef = 0.0;          // its coefficient in the objective
  std::string normalization;  // e.g. "pooled over MoE layers and tokens of the micro-batch"
};

// Routing statistics of one MoE layer in one forward.
struct MoeLayerStats {
  int layer = 0;
  std::vector<int64_t> tokens_per_expert;  // [E] top-k assignments (kept and dropped), of the whole batch
  std::vector<int64_t> rank_tokens_per_expert;  // [E] the same of this rank's rows (= the above on one rank)
  std::vector<double> prob_sums;           // [E] Σ_t router score of each expert
  int64_t dropped = 0;                     // slots over the capacity limit
  double sequence_aux = 0.0;               // this layer's sequence-wise balance loss (when in use)
  double z_loss = 0.0;                     // this layer's router z-loss (when in use)
  double max_over_mean() const;            // max load / mean load
};

// How sparse attention layers run in training and what their indexers learn from (docs/architecture.md, "The indexer's loss"):
// dense and warmup run the main attention dense and train the indexer against it over every
// visible key (warmup: DeepSeek-V3.2's first stage, where the trainer freezes everything but the
// indexers; dense: everything trains, the baseline a sparse continuation is compared with);
// sparse runs attention over the selection and trains the indexer over the selected set.
enum class IndexerMode { dense, warmup, sparse };
const char* indexer_mode_name(IndexerMode mode);
// The mode of a name indexer_mode_name gives ("dense", "warmup", "sparse"); anything else fails.
IndexerMode indexer_mode_from_name(const std::string& name);

struct IndexerTraining {
  IndexerMode mode = IndexerMode::sparse;
  double coef = 0.0;        // indexer-loss coefficient; 0: no indexer loss (inference semantics)
  // Set per forward: coef · aux scale / sparse layers (each layer's share) · this rank's token weight
  // (StatisticsReduction), the scale of the gradient of its mean over its tokens.
  double grad_scale = 0.0;
};

// One sparse layer's indexer in one training forward.
struct IndexerLayerStats {
  int layer = 0;
  double loss = 0.0;           // mean over tokens of KL(p ‖ softmax(I))
  double selected_mass = 0.0;  // mean over tokens of the main attention's mass on the selected keys
  double best_mass = 0.0;      // mean over tokens of the most mass any top-k keys hold (1 in sparse mode)
};

struct StepResult {
  CrossEntropyResult lm;            // CE sum and counted targets of this micro-batch
  std::vector<LossTerm> aux;        // empty for a model without routers or indexer loss
  std::vector<MoeLayerStats> moe;   // one per MoE layer, in layer order
  std::vector<IndexerLayerStats> indexer;  // one per sparse layer when its loss is on
  // With Model::set_check_numerics: the first sublayer output that held a NaN or an infinity,
  // "layer 3 (full_attention) mixer output" (empty: none, or not checked).
  std::string first_nonfinite_output;
  // lm.loss_sum · scales.lm + Σ coef · value · scales.aux.
  double objective(const LossScales& scales) const;
};

enum class DecisionKind { routing, selection };

class DecisionLog {
 public:
  // The decision (kind, layer) of `count` int32 values: while recording, `decide` writes it and it
  // is kept; while replaying, the kept one is returned (CHECK-fails if absent or of another size).
  const int32_t* decide(DecisionKind kind, int layer, int64_t count, const std::function<void(int32_t*)>& decide);
  void start_recording() { replaying_ = false, decisions_.clear(); }  // forget; the next passes record
  void start_replay() { replaying_ = true; }                            // keep replaying what was recorded
  void stop_replay() { replaying_ = false; }                            // record again, keeping what was
  bool replaying() const { return replaying_; }
  // The decision (kind, layer) kept by the last recording forward (CHECK-fails if absent).
  const std::vector<int32_t>& recorded(DecisionKind kind, int layer) const;

 private:
  bool replaying_ = false;
  std::map<std::pair<int, int>, std::vector<int32_t>> decisions_;
};

struct UnitHooks {
  std::function<void(int unit)> before_forward, after_forward, before_backward, after_backward;
  // Before the model first writes a unit's gradients in a step: the head's in a training forward
  // whose loss forms its gradients there, every unit's at its backward (it may come again).
  std::function<void(int unit)> before_gradients;
};

// Every rank runs each training forward on its share of the batch: its rows (every rank an equal
// number), and under context parallelism its part of each of them. The MoE layers' expert counts
// and score sums (and dropped slots) are summed over the shares, so the router losses, their
// gradients and the bias update see the whole batch's load. A share's means over its tokens (z-loss,
// the indexers' loss, selected and best masses) are weighted by its tokens, and its sequence-wise balance
// loss (its part of each of its rows' per-sequence loss, averaged over its rows) by its rows; the
// sums are the batch's means, and each share's gradients are scaled by the same weights. The
// parallel plan sets this; the model only asks it to combine. The default, one share, combines nothing.
class StatisticsReduction {
 public:
  StatisticsReduction() = default;
  // `row_shares` disjoint sets of the batch's rows; this rank holds `token_share` of the batch's
  // tokens (1 / row_shares, unless its rows are split over ranks); `sum` adds `count` doubles in
  // place over every rank.
  StatisticsReduction(int row_shares, double token_share, std::function<void(double* values, int64_t count)> sum);
  bool combines() const { return static_cast<bool>(sum_); }
  void sum(double* values, int64_t count) const { sum_(values, count); }
  // The weight of this share's mean over its tokens in the batch's mean over tokens, and of its mean
  // over its rows (of its parts of them) in the batch's mean over sequences.
  double token_weight() const { return token_share_; }
  double row_weight() const { return 1.0 / row_shares_; }
  int64_t batch_tokens(int64_t share_tokens) const { return std::llround(double(share_tokens) / token_share_); }

 private:
  int row_shares_ = 1;
  double token_share_ = 1.0;
  std::function<void(double* values, int64_t count)> sum_;
};

// What the expert exchange keeps from an MoE layer's forward for its backward: saved tensors the
// MoE kind declares (tags of kind exchanged, memory/activation_tags.h), held by the activation store
// like every other. R = the rows this rank's experts received, rows = this rank's own routed rows.
template <class T>  // T: the model's floating type in forward, const in backward
struct ExchangedRows {
  using Index = std::conditional_t<std::is_const_v<T>, const int32_t, int32_t>;
  int64_t received = 0;      // R
  Index* source = nullptr;   // [R] (chunk · ep + source rank) · local experts + local expert
  T* rows_in = nullptr;      // [R, H] the rows received
  T* gate_up_out = nullptr;  // [R, 2I] their experts' activations (backward: null where dropped, rebuilt)
  T* act = nullptr;          // [R, I] (likewise)
  T* weight = nullptr;       // [R] their combine weights
};
// The forward asks for its buffers once it knows R.
template <class T>
using ExchangedRowsFor = std::function<ExchangedRows<T>(int64_t received)>;

// Expert parallelism (parallel/expert_parallel.h): the routed experts are split over a group of
// ranks, and an MoE layer's permuted rows travel to the ranks that own their experts and back. The
// same contract as moe_experts_forward / moe_experts_backward (the weights and the experts' LoRA
// pairs hold every expert; a rank reads and accumulates only its own experts' slices); what its
// backward needs, it saves through
// `save` and gets back as `saved`.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual void forward(float* y, const float* x, const float* gate_up, const float* down, const float* weight,
                       const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<float>& adapters,
                       const ExchangedRowsFor<float>& save) = 0;
  virtual void forward(double* y, const double* x, const double* gate_up, const double* down, const double* weight,
                       const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<double>& adapters,
                       const ExchangedRowsFor<double>& save) = 0;
  virtual void backward(float* dx, float* dweight, float* dgate_up, float* ddown, const float* dy,
                        const float* gate_up, const float* down, const float* weight, const MoePlan& plan,
                        const MoeExpertDims& dims, const ExpertAdapters<float>& adapters,
                        const ExpertAdapters<float>& adapter_grads, const ExchangedRows<const float>& saved) = 0;
  virtual void backward(double* dx, double* dweight, double* dgate_up, double* ddown, const double* dy,
                        const double* gate_up, const double* down, const double* weight, const MoePlan& plan,
                        const MoeExpertDims& dims, const ExpertAdapters<double>& adapters,
                        const ExpertAdapters<double>& adapter_grads, const ExchangedRows<const double>& saved) = 0;
};

// One of the two chunks of every sequence a rank holds under context parallelism: local positions
// [offset, offset + size()) of each of its rows, global positions [begin, end).
struct ContextChunk {
  int64_t offset = 0, begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Context parallelism (parallel/context_parallel.h, docs/architecture.md "Context parallelism"):
// every sequence is split over a group of ranks, and this rank's tensors hold its part of each (two
// chunks, back to back). The model takes its tokens' positions from here, and its sequence mixers
// (attention; MLA; Gated DeltaNet's and KDA's convolution and delta rule) see every earlier token of
// their sequences through it, and the MoE layers' sequence-wise balance loss every token of them;
// every rank of the group runs the same passes. Document masks give global positions.
class ContextExchange {
 public:
  virtual ~ContextExchange() = default;
  // This rank's chunks, in the order it holds them.
  virtual std::array<ContextChunk, 2> chunks() const = 0;
  // The global position of each of this rank's `seq` tokens of a sequence, [seq].
  virtual const int32_t* positions(int64_t seq) const = 0;
  // The tokens of each whole sequence.
  virtual int64_t sequence_length() const = 0;
  // values [count] ← their sum over the group (per-sequence statistics of the MoE layers).
  virtual void sum_over_group(double* values, int64_t count) = 0;
  // Document masks: doc_start [batch, its tokens] ← the global position where each of this rank's
  // tokens' document starts (at the sequence's start and after each `eos`, whichever rank holds it).
  virtual void document_starts(int32_t* doc_start, const int32_t* tokens, int64_t batch, int32_t eos) = 0;
  // Rows of the whole sequences (attention's keys and values, MLA's absorbed rows [e | k_rot], the
  // indexer's keys): whole [batch, sequence_length(), row] ← every rank's local [batch, its tokens,
  // row]; and local ← the group's sum of their whole rows at this rank's tokens (whole is overwritten).
  virtual void gather_sequences(float* whole, const float* local, int64_t batch, int64_t row) = 0;
  virtual void gather_sequences(double* whole, const double* local, int64_t batch, int64_t row) = 0;
  virtual void reduce_sequences(float* local, float* whole, int64_t batch, int64_t row) = 0;
  virtual void reduce_sequences(double* local, double* whole, int64_t batch, int64_t row) = 0;
  // Attention of this rank's tokens over keys and values of the whole sequences built from such rows
  // (local sizes: q_len its tokens per sequence, kv_len = sequence_length(), doc_start when set in
  // global positions): dense, or (selection [its tokens, topk] of global key positions, −1 padded;
  // null: dense) sparse over the selected keys; the backward writes this rank's terms of their
  // gradients.
  virtual void gathered_attention_forward(float* out, float* lse, const float* q, const float* k_whole,
                                          const float* v_whole, const int32_t* selection, int64_t topk,
                                          const AttentionSizes& local) = 0;
  virtual void gathered_attention_forward(double* out, double* lse, const double* q, const double* k_whole,
                                          const double* v_whole, const int32_t* selection, int64_t topk,
                                          const AttentionSizes& local) = 0;
  virtual void gathered_attention_backward(float* dq, float* dk_whole, float* dv_whole, const float* dout,
                                           const float* q, const float* k_whole, const float* v_whole,
                                           const float* out, const float* lse, const int32_t* selection,
                                           int64_t topk, const AttentionSizes& local) = 0;
  virtual void gathered_attention_backward(double* dq, double* dk_whole, double* dv_whole, const double* dout,
                                           const double* q, const double* k_whole, const double* v_whole,
                                           const double* out, const double* lse, const int32_t* selection,
                                           int64_t topk, const AttentionSizes& local) = 0;
  // ops/conv1d.h's short convolution over this rank's tokens (local sizes: batch rows of its tokens
  // per sequence, no segments), each chunk reading the inputs before it from the ranks that hold
  // them; doc_start [batch, its tokens] (global positions; null: no document masks) cuts documents.
  virtual void conv1d_silu_forward(float* y, const float* x, const float* w, const int32_t* doc_start,
                                   const Conv1dSizes& local) = 0;
  virtual void conv1d_silu_forward(double* y, const double* x, const double* w, const int32_t* doc_start,
                                   const Conv1dSizes& local) = 0;
  virtual void conv1d_silu_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                    const int32_t* doc_start, const Conv1dSizes& local) = 0;
  virtual void conv1d_silu_backward(double* dx, double* dw, const double* dy, const double* x, const double* w,
                                    const int32_t* doc_start, const Conv1dSizes& local) = 0;
  // ops/delta_rule.h's chunked gated delta rule over this rank's tokens from the state the earlier
  // tokens leave (local sizes and doc_start likewise); the backward forms the exchanged chunk
  // summaries again.
  virtual void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* g,
                                  const float* beta, const int32_t* doc_start, const DeltaRuleSizes& local) = 0;
  virtual void delta_rule_forward(double* o, const double* q, const double* k, const double* v, const double* g,
                                  const double* beta, const int32_t* doc_start, const DeltaRuleSizes& local) = 0;
  virtual void delta_rule_backward(float* dq, float* dk, float* dv, float* dg, float* dbeta, const float* d_o,
                                   const float* q, const float* k, const float* v, const float* g, const float* beta,
                                   const int32_t* doc_start, const DeltaRuleSizes& local) = 0;
  virtual void delta_rule_backward(double* dq, double* dk, double* dv, double* dg, double* dbeta, const double* d_o,
                                   const double* q, const double* k, const double* v, const double* g,
                                   const double* beta, const int32_t* doc_start, const DeltaRuleSizes& local) = 0;
};

class ActivationStore;

// The gradient of the balance losses w.r.t. one MoE layer's router scores, handed to its backward:
// for pooled / per_layer, one constant per expert (already times coef and the aux scale); for
// sequence, the scale to pass to the sequence-wise loss; the z-loss scale.
struct MoeBalanceGrad {
  std::vector<double> per_expert;  // [E], or empty
  double sequence_scale = 0.0;
  double z_scale = 0.0;            // z_coef · aux scale
};

// What a pass through the layers is for: each mode fixes what the pass saves, which decisions it
// keeps and what it reports, instead of leaving that to which of LayerPass's pointers are null.
enum class PassMode {
  train,      // a training step's forward (and its backward): saves every tensor the backward needs
              // in the store, records the decisions (routing, selection), reports statistics and
              // losses, which the model reduces over the batch's shares; MoE capacity applies
  recompute,  // re-runs a sublayer whose saved tensors were dropped: refills the store, replays the
              // recorded decisions, its statistics discarded
  eval,       // a forward only (evaluation, gradient checking): saves nothing (temporaries in the
              // scratch), records the decisions (capacity applies), reports this rank's statistics
  decode,     // generation: saves nothing, takes each decision and drops it (MoE dropless), reports
              // nothing
};

struct LayerPass {
  LayerPass(PassMode mode, int64_t batch, int64_t seq) : mode(mode), batch(batch), seq(seq) {}
  PassMode mode;
  bool saves() const { return mode == PassMode::train || mode == PassMode::recompute; }
  bool keeps_decisions() const { return mode != PassMode::decode; }
  int64_t batch = 0, seq = 0;
  const int32_t* positions = nullptr;       // [batch · seq]
  const int32_t* doc_start = nullptr;       // [batch · seq] document masks: each token's document start in its row (null: off)
  const int32_t* cu_seqlens = nullptr;      // [segments + 1] document masks: the documents' starts over all tokens
  int64_t segments = 0;
  // The tokens as the linear-attention kernels take them: a segment per row, or with document
  // masks the documents, packed (batch 1, every token, cu_seqlens).
  int64_t segment_batch() const { return cu_seqlens != nullptr ? 1 : batch; }
  int64_t segment_seq() const { return cu_seqlens != nullptr ? batch * seq : seq; }
  ActivationStore* store = nullptr;         // where a pass that saves() saves (train, recompute)
  DecisionLog* decisions = nullptr;         // where a pass that keeps_decisions() keeps them
  StepResult* result = nullptr;             // forward: statistics and loss values (every mode but decode)
  const MoeBalanceGrad* balance = nullptr;  // backward of MoE layers
  const IndexerTraining* indexer = nullptr;  // sparse layers: mode and loss (null: sparse, no loss)
  ExpertExchange* experts = nullptr;         // where the routed experts run (null: here)
  ContextExchange* context = nullptr;        // this rank's part of every sequence (null: all of it)
};

}  // namespace trillion
