// Model<T>: the decoder-only language model built from a ModelConfig, single-device (parallelism
// is applied to it later). Owns the parameter table, flat parameter and gradient buffers, and the
// per-step activation store; forward and backward are explicit.
//
//   tokens ─► Embedding ─► [DecoderLayer × L] ─► RMSNorm ─► fused LM head + cross-entropy ─► loss
//   DecoderLayer: x + Attention(RMSNorm(x)); x + MLP(RMSNorm(x))
//
// T is float (training) or double (gradient checking).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/params.h"
#include "ops/cross_entropy.h"

namespace trillion {

template <class T>
class Model {
 public:
  // Validates the config for what is built (other layer kinds: "not built yet" error).
  explicit Model(const ModelConfig& config);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  const ParamTable& table() const;
  T* params();  // [table().total_size()]
  const T* params() const;
  T* grads();  // [table().total_size()]
  void init_weights(uint64_t seed);
  void zero_grads();

  // One micro-batch: tokens and targets [batch, seq] (targets kIgnoreIndex are skipped).
  // Accumulates (+=) loss_scale · d(loss_sum)/dθ into grads() and returns the loss sum and count.
  CrossEntropyResult forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                      double loss_scale);
  // Forward only (evaluation, gradient checking): saves no activations, so it needs one
  // sublayer's temporaries rather than every layer's saved activations.
  CrossEntropyResult forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);

  // Generation with a KV cache, batch 1: start_generation clears the cache; generate_step appends
  // n tokens at the next positions and writes the logits of the last one.
  void start_generation(int64_t max_len);
  void generate_step(const int32_t* tokens, int64_t n, T* last_logits /*[vocab]*/);

  // Model FLOPs of one training token (forward + backward, attention included, recompute not):
  // for model FLOPs utilization. 6 · (matmul parameters: q/k/v/o, gate/up/down of every layer and
  // the LM head, counted even when tied) + Σ_layers 3 · 4 · (seq / 2) · Hq · head_dim (causal QKᵀ
  // and PV over seq / 2 keys on average, 2 FLOPs per multiply-add; backward twice the forward).
  double training_flops_per_token(int64_t seq) const;

  // Hugging Face layout checkpoints (model.safetensors or shards + index).
  void save_weights(const std::string& directory) const;
  void load_weights(const std::string& directory);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trillion
