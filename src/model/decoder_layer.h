// A decoder layer is a mixer and an FFN, each of a declared kind, chosen per layer from the config
// by the family's rules (model/family.h, ModelConfig::layer_types and mlp_layer_types):
//
//   x ← x + Mixer(RMSNorm(x))            mixer kinds: full attention, Gated DeltaNet (qwen3_next's
//                                        linear_attention), Kimi Delta Attention (kimi_linear's),
//                                        multi-head latent attention (deepseek_v3's, kimi_linear's
//                                        full_attention)
//   x ← x + FFN(RMSNorm(x))              FFN kinds: dense SwiGLU MLP, mixture of experts
//
// The layer owns both input norms (input_layernorm, post_attention_layernorm) and the residual
// bookkeeping: each sublayer's forward saves the residual stream entering it and its norm's output
// and statistics, and its backward carries the kind's input gradient through the norm.
//
// A kind is its dims struct (from the config, naming its weights struct as Dims::Weights<T>), its
// weights struct of pointers, and free functions of one shape, found by overloading:
//   visit_params(weights, dims, visit)           its tensors, declared once (model/param_rows.h)
//   flops_per_token(dims, seq)                   training FLOPs per token
//   saved_tensors(dims, extent)                  the tensors its training forward saves, declared
//                                                once (model/saved_tensors.h)
//   workspace_bytes(dims, shape)                 its most scratch at once (model/memory_sizes.h)
//   mixers: mixer_forward / mixer_backward / mixer_decode, cache_elements(dims, max_len)
//   FFNs:   ffn_forward / ffn_backward
// Adding a kind means writing its files, adding it to the variant below (the registration line),
// choosing it in DecoderLayerDims::from_config (the family's rule) and adding the tags of the
// tensors it saves to TRILLION_ACTIVATION_TAGS (memory/activation_tags.h).
// `scratch` holds temporaries and is reset at the start of each sublayer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/attention_block.h"
#include "model/config.h"
#include "model/gated_deltanet.h"
#include "model/kimi_delta_attention.h"
#include "model/mla.h"
#include "model/mlp.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/step.h"

namespace trillion {

// The registration lines: every mixer kind and every FFN kind.
using MixerDims = std::variant<AttentionBlockDims, GatedDeltaNetDims, KimiDeltaAttentionDims, MlaDims>;
using FfnDims = std::variant<MlpDims, MoeDims>;

// The weights variant of a dims variant: Kind::Weights<T> of each kind, in the same order.
template <class T, class DimsVariant>
struct KindWeights;
template <class T, class... Kinds>
struct KindWeights<T, std::variant<Kinds...>> {
  using type = std::variant<typename Kinds::template Weights<T>...>;
};

// A decoder layer's workspace in each part of a training step.
struct LayerWorkspace {
  int64_t mixer_forward = 0, ffn_forward = 0, ffn_backward = 0, mixer_backward = 0;
  int64_t forward() const { return std::max(mixer_forward, ffn_forward); }
  int64_t backward() const { return std::max(ffn_backward, mixer_backward); }
};

struct DecoderLayerDims {
  NormSpec mixer_norm;  // input_layernorm
  MixerDims mixer;
  NormSpec ffn_norm;  // post_attention_layernorm
  FfnDims ffn;
  int64_t hidden = 0;
  static DecoderLayerDims from_config(const ModelConfig& config, int layer);
  bool is_moe() const { return std::holds_alternative<MoeDims>(ffn); }
  double flops_per_token(int64_t seq) const;        // training, forward + backward
  double mixer_flops_per_token(int64_t seq) const;  // … of the mixer alone
  double ffn_flops_per_token(int64_t seq) const;    // … of the FFN alone
  // What the mixer computes beyond its flops per token under context parallelism (each kind's
  // context_flops_per_token; the FFNs run as they do on one rank).
  double context_flops_per_token(int64_t seq) const;
  // The memory plan's sizes of the layer (model/memory_sizes.h): the tensors both sublayers save
  // (each one's input and norm, then its kind's), and the most scratch each sublayer's forward and
  // backward holds at once.
  std::vector<SavedSize> saved_sizes(const StepShape& shape) const;
  // How the mixer's and the FFN's backward read their normed input (each kind's input_use).
  InputUse mixer_input_use() const;
  InputUse ffn_input_use() const;
  LayerWorkspace workspace_bytes(const StepShape& shape) const;
  // Under context parallelism (shape.context): what the mixer's exchange receives in a training
  // step (the FFNs exchange nothing the counters count).
  ContextTraffic context_traffic(const StepShape& shape) const;
  int64_t decode_cache_elements(int64_t max_len) const;
};

template <class T>
struct DecoderLayerWeights {
  T* input_norm = nullptr;  // [D]
  typename KindWeights<T, MixerDims>::type mixer;
  T* ffn_norm = nullptr;  // [D]
  typename KindWeights<T, FfnDims>::type ffn;
};

// "model.layers.{layer}."
std::string decoder_layer_prefix(int layer);

// Adds layer `layer`'s parameters (unit 1 + layer) as its kinds declare them, with the LoRA
// adapters `lora` targets (null: none; model/param_rows.h).
void add_decoder_layer_params(ParamTable& table, const DecoderLayerDims& dims, int layer, const LoraConfig* lora);

// Pointers to layer `layer`'s tensors inside `base`: the parameters, or (gradients = true) the
// gradient buffer, where frozen tensors and buffers (no gradient) stay null.
template <class T>
DecoderLayerWeights<T> bind_decoder_layer(const ParamTable& table, T* base, bool gradients,
                                          const DecoderLayerDims& dims, int layer, const LoraConfig* lora);

// x[batch·seq, D] ← layer(x): the mixer sublayer, then the FFN sublayer, each on its own (the store
// ends each one's forward; recompute re-runs the mixer from attn_input, the FFN from ffn_input).
template <class T>
void mixer_sublayer_forward(T* x, const DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, const LayerPass& pass,
                            int layer, Arena& scratch);
template <class T>
void ffn_sublayer_forward(T* x, const DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, const LayerPass& pass,
                          int layer, Arena& scratch);

// The layer's backward in its two parts, the FFN sublayer's then the mixer sublayer's (the store
// frees the FFN's entries in between): dx[batch·seq, D] is the gradient wrt the sublayer's output on
// entry, wrt its input on return; grads +=.
template <class T>
void ffn_sublayer_backward(T* dx, const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                           const DecoderLayerDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                           Arena& scratch);
template <class T>
void mixer_sublayer_backward(T* dx, const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                             const DecoderLayerDims& dims, const LayerPass& pass, const ActivationStore& store,
                             int layer, Arena& scratch);

// Decoding (batch 1): x[n, D] ← layer(x) for n new tokens after `past` cached ones; `cache` holds
// decode_cache_elements(max_len) elements.
template <class T>
void decoder_layer_decode(T* x, int64_t n, int64_t past, int64_t max_len, T* cache, const DecoderLayerWeights<T>& w,
                          const DecoderLayerDims& dims, Arena& scratch);

}  // namespace trillion
