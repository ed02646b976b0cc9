// Model<T>::Impl, shared by model.cpp (layer stack, loss, generation) and weights.cpp
// (checkpoints). Internal to src/model/.
#pragma once

#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/decoder_layer.h"
#include "model/model.h"

namespace trillion {

template <class T>
struct Model<T>::Impl {
  ModelConfig config;
  ParamTable table;
  DecoderLayerDims dims;
  Buffer<T> params;  // [table.total_size()]
  Buffer<T> grads;   // [table.total_size()]
  ActivationStore store;  // saved activations of the current step
  Arena scratch;          // temporaries of one sublayer at a time
  Buffer<T> hidden;       // [tokens, D] residual stream
  Buffer<T> hidden_grad;  // [tokens, D] its gradient
  Buffer<int32_t> positions;  // [tokens]
  // Generation: one KV cache per layer, [max_len, Hkv, d] each.
  std::vector<Buffer<T>> k_cache, v_cache;
  int64_t cache_capacity = 0;
  int64_t cache_length = 0;

  explicit Impl(const ModelConfig& c);
  // Forward and loss. save_activations: saves every activation the backward needs in `store`
  // (training); otherwise nothing is saved and temporaries live in `scratch` one sublayer at a time.
  CrossEntropyResult forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                             bool save_activations);
  T* embedding(T* base) const { return base + table.find("model.embed_tokens.weight").offset; }
  T* final_norm(T* base) const { return base + table.find("model.norm.weight").offset; }
  // The LM head's weight [V, D]: the embedding table when tied.
  T* lm_head(T* base) const {
    return config.tie_word_embeddings ? embedding(base) : base + table.find("lm_head.weight").offset;
  }
};

}  // namespace trillion
