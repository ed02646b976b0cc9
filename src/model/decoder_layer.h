// A full-attention decoder layer: x + Attention(RMSNorm(x)), then x + MLP(RMSNorm(x)).
// Declares the layer's parameters (Hugging Face names, shapes, initializers, weight decay) and
// binds them to a flat buffer; forward / backward / decode chain the two sublayers.
// `scratch` holds temporaries and is reset at the start of each sublayer.
#pragma once

#include <cstdint>
#include <string>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/attention_block.h"
#include "model/config.h"
#include "model/mlp.h"
#include "model/params.h"

namespace trillion {

struct DecoderLayerDims {
  AttentionBlockDims attn;
  MlpDims mlp;
  static DecoderLayerDims from_config(const ModelConfig& config);
};

template <class T>
struct DecoderLayerWeights {
  AttentionBlockWeights<T> attn;
  MlpWeights<T> mlp;
};

// "model.layers.{layer}."
std::string decoder_layer_prefix(int layer);

// Adds layer `layer`'s parameters to unit 1 + layer. Initialization: q/k/v/gate/up projections
// N(0, initializer_range); o_proj and down_proj N(0, initializer_range / sqrt(2 · layers));
// norms 1 (plain) or 0 (zero-centred), without weight decay.
void add_decoder_layer_params(ParamTable& table, const ModelConfig& config, int layer);

// Pointers to layer `layer`'s tensors inside `base` (the flat parameter or gradient buffer).
template <class T>
DecoderLayerWeights<T> bind_decoder_layer(const ParamTable& table, T* base, int layer);

// x[batch·seq, D] ← layer(x), saving through `store` under `layer` (store == nullptr: forward
// only, nothing saved).
template <class T>
void decoder_layer_forward(T* x, const int32_t* positions, int64_t batch, int64_t seq, const DecoderLayerWeights<T>& w,
                           const DecoderLayerDims& dims, ActivationStore* store, int layer, Arena& scratch);

// dx[batch·seq, D]: gradient wrt the layer output on entry, wrt its input on return; grads +=.
template <class T>
void decoder_layer_backward(T* dx, const int32_t* positions, int64_t batch, int64_t seq,
                            const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                            const DecoderLayerDims& dims, const ActivationStore& store, int layer, Arena& scratch);

// Decoding (batch 1): x[n, D] ← layer(x) for n new tokens after `past` cached ones.
template <class T>
void decoder_layer_decode(T* x, int64_t n, int64_t past, T* k_cache, T* v_cache, const DecoderLayerWeights<T>& w,
                          const DecoderLayerDims& dims, Arena& scratch);

}  // namespace trillion
