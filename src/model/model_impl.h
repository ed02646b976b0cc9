// Model<T>::Impl, shared by model.cpp (layer stack, loss), generation.cpp (decoding) and
// weights.cpp (checkpoints), with the helpers they share. Internal to src/model/.
#pragma once

#include <optional>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "core/error.h"
#include "model/decoder_layer.h"
#include "model/family.h"
#include "model/model.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"

namespace trillion {

// The final RMSNorm of a config's family (zero-centred for Qwen3-Next).
inline NormSpec final_norm_spec(const ModelConfig& config) {
  return {config.rms_norm_eps, family_of(config.model_type).zero_centred_norms};
}

// Fails naming the position when a token (or a target other than kIgnoreIndex) is outside the vocab.
inline void check_tokens(const int32_t* tokens, const int32_t* targets, int64_t count, int64_t vocab) {
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) fail("token ", tokens[i], " at position ", i, " is outside [0, ", vocab, ")");
    if (targets != nullptr && targets[i] != kIgnoreIndex && (targets[i] < 0 || targets[i] >= vocab))
      fail("target ", targets[i], " at position ", i, " is outside [0, ", vocab, ") and is not ", kIgnoreIndex);
  }
}

// Grows (never shrinks) a buffer to at least `count` elements.
template <class U>
void ensure_size(Buffer<U>& buffer, int64_t count) {
  if (buffer.size() < count) buffer = Buffer<U>(count);
}

// A tensor that a bf16-only base holds in bf16 alone (Model::keep_frozen_base_in_bf16_only):
// frozen, and read only through products (the base's linear weights).
inline bool held_in_bf16_only(const ParamSpec& spec) { return spec.frozen && spec.use == ParamUse::products; }

template <class T>
struct Model<T>::Impl {
  ModelConfig config;
  ParamTable table;
  std::vector<DecoderLayerDims> layer_dims;  // [L] each layer's kinds
  Buffer<T> params;  // [table.total_size()]
  Buffer<T> grads;   // [table.trainable_size()]
  std::vector<DecoderLayerWeights<T>> layer_params, layer_grads;  // [L], bound once
  ActivationStore store;  // saved activations of the current step
  DecisionLog decisions;
  UnitHooks hooks;
  StatisticsReduction reduction;  // training forwards: statistics over the data-parallel batch's shares
  ExpertExchange* exchange = nullptr;  // training: where the routed experts run (null: here)
  ContextExchange* context = nullptr;  // training and evaluation passes: this rank's part of every sequence (null: all)
  std::optional<LoraDropoutPass> lora_dropout;  // set: the passes draw LoRA's dropout masks
  IndexerTraining indexer;  // sparse layers' mode and loss; grad_scale set per forward
  LossGradients loss_gradients = LossGradients::in_forward;
  Arena scratch;          // temporaries of one sublayer at a time
  Buffer<T> hidden;       // [tokens, D] residual stream
  Buffer<T> hidden_grad;  // [tokens, D] its gradient
  Buffer<T> recompute_hidden;  // [tokens, D] the residual stream of a layer being recomputed
  Buffer<int32_t> positions;  // [tokens] RoPE positions: in the row, or in the document (document masks)
  int32_t document_eos = -1;  // document masks: the token that ends a document (-1: off)
  bool check_numerics = false;  // name the first non-finite sublayer output of each forward
  int nan_after_layer = -1;     // test hook: a NaN after this layer's FFN (-1: off)
  Buffer<int32_t> doc_start;  // [tokens] document masks: the row position where each token's document starts
  std::vector<int32_t> cu_seqlens;  // [documents + 1] document masks: the documents' starts over all tokens
  // The bf16 precision on one rank: a bf16 copy of the parameters, which the products read instead
  // of rounding each weight at each product (ops/gemm.h, Bf16OperandCopy). Under unit hooks (FSDP)
  // there is none: FSDP gathers the units into a copy of its own (parallel/fsdp.h). Declared after
  // `params`, so it unregisters before the buffer it copies is freed.
  std::optional<Bf16OperandCopy> bf16_params;
  // LoRA's frozen base in bf16 only (Model::keep_frozen_base_in_bf16_only): the float elements
  // [begin, end) whose pages are released, their values in bf16_params alone. Declared after
  // `params`, so the pages are mapped back before the buffer is freed.
  bool bf16_only_base = false;
  std::vector<std::pair<int64_t, int64_t>> released_ranges;
  ReleasedPages released_pages;
  // Generation: one decode cache per layer (its kinds say how large).
  std::vector<Buffer<T>> caches;
  int64_t cache_capacity = 0;
  int64_t cache_length = 0;

  explicit Impl(const ModelConfig& c);
  // Forward and loss terms, in mode train (saves every activation the backward needs in `store`,
  // statistics reduced over the batch's shares) or eval (nothing is saved, temporaries live in `scratch`
  // one sublayer at a time; this rank's statistics). scales: the step's loss scales, for the
  // losses whose gradients are formed in the forward (the LM head's in training unless
  // loss_gradients is recompute; the indexer's).
  StepResult forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq, PassMode mode,
                     const LossScales& scales);
  // Before a forward or a generation: the parameters' bf16 copy made or refreshed where it is
  // used (float parameters, the bf16 precision, no unit hooks), dropped otherwise (the base
  // restored first).
  // Then, with bf16_only_base and `may_release`, the frozen base's float pages released once the
  // copy holds them; a copy with released ranges refreshes the rest only.
  void refresh_bf16_params(bool may_release = true);
  // The released float pages mapped back, holding their bf16 values widened (exact), before
  // anything reads or writes the base's floats (load, init, generation, another precision).
  void restore_base();
  // Before the backward of `layer`: re-runs the sublayers whose saved tensors the store dropped
  // (mixer from attn_input, FFN from ffn_input), decisions replayed, statistics discarded.
  void recompute(int layer, int64_t batch, int64_t seq);
  // Document masks (when on): the step's document starts, per row and (without context
  // parallelism) packed, into the pass.
  void document_segments(LayerPass& pass) const {
    if (document_eos < 0) return;
    pass.doc_start = doc_start.data();
    if (cu_seqlens.empty()) return;
    pass.cu_seqlens = cu_seqlens.data();
    pass.segments = static_cast<int64_t>(cu_seqlens.size()) - 1;
  }
  // --check-numerics: names the sublayer in result unless an earlier one was named or x[count] is finite.
  void check_output(StepResult& result, const T* x, int64_t count, int layer, const char* sublayer) const;
  // The indexer loss term of a forward from its per-layer values (appended to result.aux).
  void add_indexer_loss(StepResult& result) const;
  // Sums a training forward's statistics over the batch's shares, its means weighted by each share's
  // tokens or rows (StatisticsReduction).
  void reduce_statistics(StepResult& result) const;
  // The router loss terms of a forward from its per-layer statistics (appended to result.aux);
  // tokens: of the whole batch the statistics cover.
  void add_router_losses(StepResult& result, int64_t tokens) const;
  // The balance-loss gradient handed to MoE layer `layer`'s backward; tokens as above.
  MoeBalanceGrad balance_grad(const StepResult& result, int layer, int64_t tokens, double aux_scale) const;
  const MoeDims* first_moe() const;  // null without MoE layers
  int sparse_layers() const;         // layers of type sparse_attention
  T* embedding(T* base) const { return base + table.find("model.embed_tokens.weight").offset; }
  T* final_norm(T* base) const { return base + table.find("model.norm.weight").offset; }
  // The LM head's weight [V, D]: the embedding table when tied.
  T* lm_head(T* base) const {
    return config.tie_word_embeddings ? embedding(base) : base + table.find("lm_head.weight").offset;
  }
  // Their gradients, null where frozen (LoRA's base).
  T* embedding_grad() { return grad_of("model.embed_tokens.weight"); }
  T* final_norm_grad() { return grad_of("model.norm.weight"); }
  T* lm_head_grad() { return config.tie_word_embeddings ? embedding_grad() : grad_of("lm_head.weight"); }
  T* grad_of(const std::string& name) {
    const ParamSpec& spec = table.find(name);
    return spec.trainable() ? grads.data() + spec.offset : nullptr;
  }
};

}  // namespace trillion
