// A decoder layer is a mixer and an FFN, each of a declared kind, chosen per layer from the config
// by the family's rules (model/family.h, ModelConfig::layer_types and mlp_layer_types):
//
//   x ← x + Mixer(x)                     mixer kinds: full attention (its input norm inside)
//   x ← x + FFN(RMSNorm(x))              FFN kinds: dense SwiGLU MLP, mixture of experts
//
// A kind is its dims struct (from the config), its weights struct of pointers, and free functions
// of one shape: visit_params (its tensors, declared once: model/param_rows.h), forward, backward,
// decode and FLOPs. Adding a kind means writing its files and adding it to the variant below (the
// one registration line) and to the dispatch in decoder_layer.cpp.
// `scratch` holds temporaries and is reset at the start of each sublayer.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/attention_block.h"
#include "model/config.h"
#include "model/mlp.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/step.h"

namespace trillion {

// The registration lines: every mixer kind and every FFN kind.
using MixerDims = std::variant<AttentionBlockDims>;
using FfnDims = std::variant<MlpDims, MoeDims>;

struct DecoderLayerDims {
  MixerDims mixer;
  NormSpec ffn_norm;  // post_attention_layernorm
  FfnDims ffn;
  int64_t hidden = 0;
  static DecoderLayerDims from_config(const ModelConfig& config, int layer);
  bool is_moe() const { return std::holds_alternative<MoeDims>(ffn); }
  double flops_per_token(int64_t seq) const;        // training, forward + backward
  int64_t decode_cache_elements(int64_t max_len) const;
};

template <class T>
struct DecoderLayerWeights {
  std::variant<AttentionBlockWeights<T>> mixer;
  T* ffn_norm = nullptr;  // [D]
  std::variant<MlpWeights<T>, MoeWeights<T>> ffn;
};

// "model.layers.{layer}."
std::string decoder_layer_prefix(int layer);

// Adds layer `layer`'s parameters (unit 1 + layer) as its kinds declare them.
void add_decoder_layer_params(ParamTable& table, const DecoderLayerDims& dims, int layer);

// Pointers to layer `layer`'s tensors inside `base`: the parameters, or (gradients = true) the
// gradient buffer, where buffers (no gradient) stay null.
template <class T>
DecoderLayerWeights<T> bind_decoder_layer(const ParamTable& table, T* base, bool gradients,
                                          const DecoderLayerDims& dims, int layer);

// What the layer loops pass to every layer.
struct LayerPass {
  int64_t batch = 0, seq = 0;
  const int32_t* positions = nullptr;  // [batch · seq]
  ActivationStore* store = nullptr;    // forward: null = nothing saved (evaluation)
  DecisionLog* decisions = nullptr;
  StepResult* result = nullptr;        // forward: statistics and loss values
  const MoeBalanceGrad* balance = nullptr;  // backward of MoE layers
};

// x[batch·seq, D] ← layer(x).
template <class T>
void decoder_layer_forward(T* x, const DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, const LayerPass& pass,
                           int layer, Arena& scratch);

// dx[batch·seq, D]: gradient wrt the layer output on entry, wrt its input on return; grads +=.
template <class T>
void decoder_layer_backward(T* dx, const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                            const DecoderLayerDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                            Arena& scratch);

// Decoding (batch 1): x[n, D] ← layer(x) for n new tokens after `past` cached ones; `cache` holds
// decode_cache_elements(max_len) elements.
template <class T>
void decoder_layer_decode(T* x, int64_t n, int64_t past, int64_t max_len, T* cache, const DecoderLayerWeights<T>& w,
                          const DecoderLayerDims& dims, Arena& scratch);

}  // namespace trillion
