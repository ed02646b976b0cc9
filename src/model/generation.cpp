// Model<T>'s generation: a decode cache per layer (KV cache, recurrent state, conv window, as each
// layer kind needs), and one decode step over new tokens that returns the last token's logits.
#include "model/model.h"

#include "core/error.h"
#include "model/linear.h"
#include "model/model_impl.h"
#include "ops/embedding.h"
#include "ops/norm.h"

namespace trillion {

template <class T>
void Model<T>::start_generation(int64_t max_len) {
  Impl& m = *impl_;
  if (max_len <= 0) fail("generation length ", max_len, " must be positive");
  m.caches.clear();
  for (const DecoderLayerDims& dims : m.layer_dims) {
    m.caches.emplace_back(dims.decode_cache_elements(max_len));
    m.caches.back().zero();  // recurrent states and conv windows start at zero
  }
  m.cache_capacity = max_len;
  m.cache_length = 0;
  m.restore_base();  // decoding's merged weights (MLA's absorbed kv_b_proj) read the base's floats
  m.refresh_bf16_params(/*may_release=*/false);
}

template <class T>
void Model<T>::generate_step(const int32_t* tokens, int64_t n, T* last_logits) {
  Impl& m = *impl_;
  TRILLION_CHECK(n > 0, "generate_step needs at least one token");
  if (m.cache_length + n > m.cache_capacity)
    fail("generation: ", m.cache_length + n, " tokens exceed the KV cache of ", m.cache_capacity,
         " (start_generation's max_len)");
  const int64_t D = m.config.hidden_size, V = m.config.vocab_size;
  check_tokens(tokens, nullptr, n, V);
  ensure_size(m.hidden, n * D);
  T* params = m.params.data();
  T* x = m.hidden.data();  // [n, D]
  embedding_forward(x, m.embedding(params), tokens, n, D, V);
  for (int layer = 0; layer < m.config.num_hidden_layers; ++layer) {
    decoder_layer_decode(x, n, m.cache_length, m.cache_capacity, m.caches[layer].data(), m.layer_params[layer],
                         m.layer_dims[layer], m.scratch);
  }
  m.scratch.reset();
  const NormSpec norm = final_norm_spec(m.config);
  T* h = m.scratch.template alloc<T>(D);  // [1, D] final-normed last token
  T* rstd = m.scratch.template alloc<T>(1);  // [1]
  rmsnorm_forward(h, rstd, x + (n - 1) * D, m.final_norm(params), 1, D, norm.eps, norm.zero_centred);
  LinearWeights<T> head;
  head.weight = m.lm_head(params);
  linear(last_logits, h, head, 1, D, V, /*accumulate=*/false);  // [1, V]
  m.cache_length += n;
  m.scratch.reset();
}

#define TRILLION_INSTANTIATE(T)                                  \
  template void Model<T>::start_generation(int64_t);             \
  template void Model<T>::generate_step(const int32_t*, int64_t, T*);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
