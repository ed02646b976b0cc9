// The attention sublayer of a decoder layer, Qwen3 style (and Qwen3-Next style when gated):
//   h = RMSNorm(x);  q = RoPE(q_norm(h·Wqᵀ)), k = RoPE(k_norm(h·Wkᵀ)), v = h·Wvᵀ  (q_norm/k_norm per head)
//   o = causal GQA attention(q, k, v) with scale head_dim^−½
//   qwen3_next: q_proj gives 2·d outputs per head (query, then gate) and o ← o · sigmoid(gate)
//   x ← x + o·Woᵀ
// Training forward saves through the ActivationStore (tags attn_input … o_proj_in), a forward-only
// pass keeps them in scratch; decoding
// runs n new tokens against a KV cache. Gradient rule: the residual gradient dx is accumulated
// (+=) with the sublayer's input gradient; parameter gradients accumulate (+=).
#pragma once

#include <cstdint>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"

namespace trillion {

struct AttentionBlockDims {
  int64_t hidden = 0;      // D
  int64_t q_heads = 0;     // Hq
  int64_t kv_heads = 0;    // Hkv
  int64_t head_dim = 0;    // d
  int64_t rotary_dim = 0;  // first rotary_dim dims of each head are rotated
  double rope_theta = 10000.0;
  double eps = 1e-6;
  bool zero_centred = false;  // RMSNorms y = x̂(1 + w)
  bool gated = false;         // q_proj carries the sigmoid output gate
  static AttentionBlockDims from_config(const ModelConfig& config);
  int64_t q_width() const { return q_heads * head_dim; }                 // Hq·d
  int64_t kv_width() const { return kv_heads * head_dim; }               // Hkv·d
  int64_t q_proj_out() const { return (gated ? 2 : 1) * q_width(); }     // rows of q_proj.weight
};

// Pointers into a flat buffer (the parameters, or their gradients), Hugging Face shapes.
template <class T>
struct AttentionBlockWeights {
  T* input_norm = nullptr;  // [D]
  T* q_proj = nullptr;      // [q_proj_out, D]
  T* k_proj = nullptr;      // [Hkv·d, D]
  T* v_proj = nullptr;      // [Hkv·d, D]
  T* o_proj = nullptr;      // [D, Hq·d]
  T* q_norm = nullptr;      // [d]
  T* k_norm = nullptr;      // [d]
};

// x[batch·seq, D] += attention sublayer(x); positions[batch·seq] are 0..seq−1 per sequence.
// Saves what the backward needs in `store` under `layer`; store == nullptr (forward only, e.g.
// evaluation) keeps everything in `scratch` instead. Temporaries come from `scratch` (the caller
// resets it between sublayers).
template <class T>
void attention_block_forward(T* x, const int32_t* positions, int64_t batch, int64_t seq,
                             const AttentionBlockWeights<T>& w, const AttentionBlockDims& dims,
                             ActivationStore* store, int layer, Arena& scratch);

// dx[batch·seq, D]: gradient wrt the sublayer's output on entry; the sublayer's input gradient is
// added (+=), so on return it is the gradient wrt x. grads += parameter gradients.
template <class T>
void attention_block_backward(T* dx, const int32_t* positions, int64_t batch, int64_t seq,
                              const AttentionBlockWeights<T>& w, const AttentionBlockWeights<T>& grads,
                              const AttentionBlockDims& dims, const ActivationStore& store, int layer,
                              Arena& scratch);

// Decoding (batch 1): x[n, D] += sublayer(x) for n new tokens at positions past..past+n−1; their
// keys and values are written to rows past.. of k_cache / v_cache [max_len, Hkv, d] and attention
// runs with q_len = n, kv_len = past + n (bottom-right causal).
template <class T>
void attention_block_decode(T* x, int64_t n, int64_t past, T* k_cache, T* v_cache, const AttentionBlockWeights<T>& w,
                            const AttentionBlockDims& dims, Arena& scratch);

}  // namespace trillion
