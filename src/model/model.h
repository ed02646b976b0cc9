// Model<T>: the decoder-only language model built from a ModelConfig, single-device (parallelism
// is applied to it through its hooks, parallel/). Owns the parameter table, flat parameter and gradient buffers, the
// pointers of every layer bound once, the per-step activation store and the decision log; forward
// and backward are explicit.
//
//   tokens ─► Embedding ─► [DecoderLayer × L] ─► RMSNorm ─► fused LM head + cross-entropy ─► loss
//   DecoderLayer: x + Mixer(x); x + FFN(RMSNorm(x))   (kinds per layer: model/decoder_layer.h)
//
// T is float (training) or double (gradient checking).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/adapter_layout.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/params.h"
#include "model/saved_tensors.h"
#include "memory/activation_store.h"
#include "model/step.h"
#include "ops/cross_entropy.h"

namespace trillion {

// Parameter counts of a config, from its parameter table alone (no weights are allocated); a
// linear_attention layer outside qwen3_next and kimi_linear is an error, not a guess. total = trainable parameters (what
// transformers' num_parameters() counts: buffers excluded); active = the parameters one token
// uses: dense ones and k / E of the routed experts.
struct ParamCounts {
  int64_t total = 0, active = 0, dense = 0, expert = 0, buffer = 0;
  int64_t storage = 0;            // elements of the parameter buffer (padding included)
  int64_t trainable_storage = 0;  // elements of the gradient buffer (and of each AdamW moment)
  int64_t sharded_storage = 0;    // elements FSDP shards: the trainable and the frozen ones
  int64_t trainable = 0;          // trainable parameters: all of them, or under LoRA the adapters' (and modules_to_save)
  int64_t with_adapters = 0;      // total with the adapters' parameters
};
ParamCounts count_parameters(const ModelConfig& config);
ParamCounts count_parameters(const ModelConfig& config, const ParamTable& table);  // its table, built already
// The parameter table a Model of the config lays out (shapes and offsets; nothing allocated).
ParamTable param_table_of(const ModelConfig& config);
// Model FLOPs of one training token (Model::training_flops_per_token) from a config and its
// parameter table alone, and the part of them the routed experts do (their owners', under ep).
struct TrainingFlops {
  double per_token = 0.0, routed_experts = 0.0;
};
TrainingFlops training_flops_of(const ModelConfig& config, const ParamTable& table, int64_t seq);
// The bytes Model::save_adapter holds while writing the adapter of `config` in `layout`: the pairs
// it converts to that layout and its copies of the fused-layout lora_B tensors in PEFT's rank-major
// order (model/adapter_weights.cpp).
int64_t adapter_file_staging_bytes(const ModelConfig& config, ExpertLayout layout, int64_t element_bytes);
// The float elements [begin, end) of a LoRA model's parameters that Model::keep_frozen_base_in_bf16_only
// releases: the whole pages inside each run of frozen tensors that only products read (the base's
// linear weights), when the buffer is page-mapped (core/memory.h); none otherwise.
std::vector<std::pair<int64_t, int64_t>> bf16_only_base_ranges(const ParamTable& table);
// Refuses, naming the tensor or field, an adapter of `config` that cannot be written in `layout`
// (model/adapter_layout.h): what Model::save_adapter would refuse, known before training.
void check_adapter_layout(const ModelConfig& config, ExpertLayout layout);
// The tensors the head saves under layer L in a training forward of n tokens (model/saved_tensors.h):
// the final norm's input and statistics, and the loss's gradient wrt the norm's output when it is
// formed in the forward, else that output and the LM head's log-sum-exp.
std::vector<SavedTensor> head_saved_tensors(int64_t tokens, int64_t hidden, bool gradients_in_forward);
// How the head's backward reads the final norm's output: as the LM head's operand when it recomputes
// the loss's tiles, not at all when the loss's gradients were formed in the forward.
inline InputUse head_input_use(bool gradients_in_forward) {
  return gradients_in_forward ? InputUse::unread : InputUse::operand;
}

// The FSDP units (the parameter table's units) in the order a training step reaches them: its
// forward's before_forward hooks, then its backward's before_backward hooks. Unit 0 holds the
// embeddings, 1 + l decoder layer l, and 1 + L the final norm and the untied LM head. Tied, the
// final norm and the head are unit 0's too, which then stays in use from the embedding to the head
// (forward) and from the head to the embedding's gradient (backward).
struct UnitOrder {
  std::vector<int> forward;   // 0, 1, …, L, then 1 + L when untied
  std::vector<int> backward;  // the head's unit, L, …, 1, then 0 when untied
};
int head_unit(const ModelConfig& config);  // 0 when tied, else 1 + L
UnitOrder unit_order(const ModelConfig& config);

template <class T>
class Model {
 public:
  // Validates the config for what is built (linear attention outside its families: "not built yet").
  explicit Model(const ModelConfig& config);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  const ParamTable& table() const;
  // [table().total_size()]. Under the bf16 matmul precision the products read a bf16 copy of it,
  // made at the start of each forward and generation: write it between those, not within them.
  T* params();
  const T* params() const;
  T* grads();  // [table().trainable_size()]: the trainable groups only
  void init_weights(uint64_t seed);
  void zero_grads();
  // LoRA under the bf16 matmul precision on one rank (float parameters, no unit hooks): the frozen
  // base's linear weights, which only products read, become their bf16 values, kept in the
  // parameters' bf16 copy alone.
  // The copy is made now and their float pages (bf16_only_base_ranges) released: they fault when
  // read through params(). save_weights writes those tensors as BF16 from the copy; init_weights,
  // load_weights and generation map the pages back first, holding the bf16 values widened, and the
  // next forward releases them again.
  void keep_frozen_base_in_bf16_only();
  int64_t released_base_bytes() const;  // float bytes released now

  // One micro-batch: tokens and targets [batch, seq] (targets kIgnoreIndex are skipped).
  // Accumulates (+=) d(objective)/dθ into grads(), objective = StepResult::objective(scales), and
  // returns the loss terms and per-layer statistics.
  StepResult forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                              const LossScales& scales);
  // Forward only (evaluation, gradient checking): saves no activations, so it needs one
  // sublayer's temporaries rather than every layer's saved activations.
  StepResult forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);

  // Discrete decisions (routing): each forward records them, unless the log is replaying
  // (decisions().start_replay(): gradient checking's perturbed passes, recomputation).
  DecisionLog& decisions();
  // Called around each FSDP unit (unit_order) in forward and backward; identity by default.
  void set_unit_hooks(UnitHooks hooks);
  // Data parallelism: forward_backward's statistics over the batch's shares (step.h); forward_loss
  // keeps its own batch's (evaluation runs the same batches on every rank).
  void set_statistics_reduction(StatisticsReduction reduction);
  // Expert parallelism (null: every expert runs here; must outlive its use): every forward uses
  // it, so every rank of its group must run the same forwards, recomputation included.
  void set_expert_exchange(ExpertExchange* exchange);
  // Context parallelism (null: whole sequences here; must outlive its use): forward_backward's and
  // forward_loss's rows hold this rank's tokens of each sequence, and their passes take their
  // positions and attention from it, so every rank of its group runs the same passes.
  // Not with recomputed mixers (the run's memory policy refuses them before the first step).
  void set_context_exchange(ContextExchange* context);
  // LoRA's dropout (model/linear.h) in the passes that follow: forward_backward and forward_loss
  // draw its masks while set (the trainer sets it per micro-batch; evaluation leaves it unset).
  void set_lora_dropout(const std::optional<LoraDropoutPass>& pass);
  // How sparse attention layers train (IndexerTraining: mode, indexer-loss coefficient). Default:
  // sparse attention, no indexer loss (transformers' forward). The loss appears in StepResult.aux
  // as "indexer_loss" (mean over sparse layers), its per-layer values in StepResult.indexer.
  void set_indexer_training(IndexerMode mode, double coef);
  // Document masks (packed rows): with eos_id ≥ 0, a document ends after each eos input token, and
  // no token attends across a document start; RoPE positions restart at 0 with each document.
  // Built for every mixer kind (linear attention's conv window and state restart, sparse
  // attention's indexer selects within the document). -1: off (the default).
  void set_document_mask(int32_t eos_id);
  // --check-numerics: every forward checks the residual stream after each sublayer and names the
  // first that is not finite in StepResult.first_nonfinite_output (one scan of [tokens, D] each).
  void set_check_numerics(bool on);
  // Test hook of the numeric guards: the next forwards write a NaN into the residual stream right
  // after layer `layer`'s FFN sublayer (-1: off, the default).
  void inject_nan_after_layer(int layer);
  // How the LM head's loss forms its gradients in training (LossGradients; default in_forward).
  void set_loss_gradients(LossGradients mode);
  // The saved activations of training steps: their policies (keep, recompute, swap per tag), the
  // swap directory, and what the policies did (counters). Set between steps.
  ActivationStore& activations();
  // Empties the layers' scratch arena (so that a measurement starts from nothing): call it
  // between units (a hook), where nothing lives in it.
  void reset_workspace();
  int sparse_layers() const;
  // MoE layers' correction biases (sigmoid routers), for the aux-loss-free update: per MoE layer,
  // its layer index and a pointer to its [E] bias in params(). Empty without such layers.
  std::vector<std::pair<int, T*>> correction_biases();

  // Generation with a KV cache, batch 1: start_generation clears the cache; generate_step appends
  // n tokens at the next positions and writes the logits of the last one.
  void start_generation(int64_t max_len);
  void generate_step(const int32_t* tokens, int64_t n, T* last_logits /*[vocab]*/);

  // Model FLOPs of one training token (forward + backward, attention included, recompute not):
  // for model FLOPs utilization. Σ_layers of each kind's FLOPs (attention: 6 · projection
  // parameters + 3 · 4 · (seq / 2) · Hq · head_dim; dense MLP 18 · D · I; MoE the active ones:
  // router 6 · D · E, k experts 18 · k · D · I, shared experts) + 6 · V · D for the LM head
  // (counted even when tied). With LoRA, a frozen linear weight's products skip its gradient (4 of
  // 6 per weight and token; routed experts at k / E of theirs; the router's 6 stay), and each
  // adapter adds 8 per element of A (x·Aᵀ, its recompute, dA, dx) and 6 per element of B.
  double training_flops_per_token(int64_t seq) const;

  // Hugging Face layout checkpoints (model.safetensors or shards + index), stored as T, or as
  // bfloat16 (rounded to nearest even) with `bfloat16`: what `export --dtype bfloat16` writes.
  void save_weights(const std::string& directory, bool bfloat16 = false) const;
  void load_weights(const std::string& directory);
  // A LoRA model's adapter as PEFT stores it (model/adapter_weights.cpp): DIR/adapter_config.json
  // (config().lora) and DIR/adapter_model.safetensors, every trainable tensor under
  // "base_model.model." + its name, in the model's float type, the routed experts' pairs in `layout`
  // (model/adapter_layout.h). Loading reads every one of them (all or nothing) and nothing else.
  void save_adapter(const std::string& directory, ExpertLayout layout = ExpertLayout::as_trained) const;
  void load_adapter(const std::string& directory);
  // Writes this LoRA model's weights with every pair folded in (W + scaling · B · A, float
  // operands) and its saved modules as trained into `plain`, a model of the same config without
  // LoRA: what `trillion merge` saves.
  void merge_adapter_into(Model<T>& plain) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trillion
