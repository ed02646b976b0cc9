// The input of a normed part of the model, written once for the three that have one: the mixer
// sublayer (input_layernorm), the FFN sublayer (post_attention_layernorm) and the head (the final
// norm). Each saves the residual stream entering it (the mixer's and the head's: recompute's
// checkpoints), its RMSNorm's statistics and output h, which is what its kind reads; its backward
// carries the kind's gradient wrt h through the norm into the residual stream's gradient.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/saved_tensors.h"
#include "model/step.h"
#include "ops/norm.h"

namespace trillion {

// The tags of the residual stream, the norm's statistics and its output.
struct SublayerInputTags {
  ActivationTag input, rstd, normed;
};
constexpr SublayerInputTags kMixerInput{ActivationTag::attn_input, ActivationTag::attn_norm_rstd,
                                        ActivationTag::attn_norm_out};
constexpr SublayerInputTags kFfnInput{ActivationTag::ffn_input, ActivationTag::ffn_norm_rstd,
                                      ActivationTag::ffn_norm_out};
constexpr SublayerInputTags kHeadInput{ActivationTag::final_input, ActivationTag::final_norm_rstd,
                                       ActivationTag::final_norm_out};

inline std::vector<SavedTensor> input_saved_tensors(const SublayerInputTags& tags, int64_t tokens, int64_t hidden,
                                                    InputUse use) {
  return {{tags.input, {tokens, hidden}},  // [n, D] the residual stream
          {tags.rstd, {tokens}},           // [n]
          {tags.normed, {tokens, hidden}, use != InputUse::unread, use == InputUse::operand}};  // [n, D] h, the part's input
}

// h[n, D] = norm(x[n, D]) for the pass's n tokens: x, the statistics and h saved under `layer` (in
// scratch when nothing is saved).
template <class T>
const T* sublayer_input_forward(const T* x, const T* weight, const NormSpec& norm, const SublayerInputTags& tags,
                                InputUse use, int64_t hidden, const LayerPass& pass, int layer, Arena& scratch) {
  const int64_t n = pass.batch * pass.seq, D = hidden;
  const SavedWriter saves(input_saved_tensors(tags, n, D, use), pass.store, layer, scratch);
  T* input = saves.out<T>(tags.input);  // [n, D]
  std::memcpy(input, x, n * D * sizeof(T));
  T* rstd = saves.out<T>(tags.rstd);  // [n]
  T* h = saves.out<T>(tags.normed);   // [n, D]
  rmsnorm_forward(h, rstd, input, weight, n, D, norm.eps, norm.zero_centred);
  return h;
}

// What sublayer_input_forward saved.
template <class T>
struct SublayerInput {
  const T* input;  // [n, D]
  const T* rstd;   // [n]
  const T* h;      // [n, D]; null when the part's backward does not read it
};

template <class T>
SublayerInput<T> saved_sublayer_input(const SublayerInputTags& tags, InputUse use, int64_t hidden,
                                      const LayerPass& pass, const ActivationStore& store, int layer) {
  const SavedReader saved(input_saved_tensors(tags, pass.batch * pass.seq, hidden, use), store, layer);
  return {saved.in<T>(tags.input), saved.in<T>(tags.rstd),
          use == InputUse::unread ? nullptr : saved.in<T>(tags.normed)};
}

// dx[n, D] (+= when accumulate, else =) the gradient through the norm of dh[n, D]; dweight +=.
template <class T>
void sublayer_input_backward(T* dx, T* dweight, const T* dh, const SublayerInput<T>& in, const T* weight,
                             const NormSpec& norm, int64_t tokens, int64_t hidden, bool accumulate) {
  rmsnorm_backward(dx, dweight, dh, in.input, weight, in.rstd, tokens, hidden, norm.zero_centred, accumulate);
}

}  // namespace trillion
