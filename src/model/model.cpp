// Model<T>: parameter table, layer stack, final norm, fused LM-head cross-entropy, and generation
// with a KV cache. Checkpoints are in weights.cpp.
#include "model/model.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/model_impl.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/norm.h"

namespace trillion {
namespace {

// Rejects what the config can describe but the engine does not build yet, naming the file.
void check_buildable(const ModelConfig& config) {
  const std::string source = config.source.empty() ? "config" : config.source;
  // qwen3_moe builds as qwen3 while it has no experts (num_experts is checked below).
  if (config.model_type != "qwen3" && config.model_type != "qwen3_next" && config.model_type != "qwen3_moe")
    fail(source, ": model_type ", config.model_type, ": not built yet; expected qwen3, qwen3_next or qwen3_moe");
  if (config.hidden_act != "silu")
    fail(source, ": field \"hidden_act\": \"", config.hidden_act, "\": not built yet; expected \"silu\"");
  if (!config.rope_scaling.is_null())
    fail(source, ": field \"rope_scaling\": ", config.rope_scaling.dump(), ": not built yet; expected null");
  if (config.use_sliding_window) fail(source, ": field \"use_sliding_window\": true: not built yet; expected false");
  for (size_t i = 0; i < config.layer_types.size(); ++i) {
    if (config.layer_types[i] != LayerType::full_attention)
      fail(source, ": layer_types[", i, "] = ", layer_type_name(config.layer_types[i]), ": not built yet");
  }
  TRILLION_CHECK(static_cast<int64_t>(config.layer_types.size()) == config.num_hidden_layers,
                 "layer_types has ", config.layer_types.size(), " entries for ", config.num_hidden_layers, " layers");
  if (config.attention_bias) fail(source, ": attention_bias = true: not built yet");
  if (config.num_experts > 0)
    fail(source, ": num_experts = ", config.num_experts, ": mixture of experts not built yet");
}

// Unit 0: embeddings, final norm, LM head; unit 1 + l: decoder layer l. Embeddings and norms have
// no weight decay; projections (the untied LM head included) do.
ParamTable build_param_table(const ModelConfig& config) {
  ParamTable table;
  const int64_t V = config.vocab_size, D = config.hidden_size;
  ParamSpec embed{"model.embed_tokens.weight", {V, D}};
  embed.init = InitKind::normal;
  embed.init_std = config.initializer_range;
  embed.weight_decay = false;
  table.add(embed);
  ParamSpec norm{"model.norm.weight", {D}};
  norm.init = config.zero_centred_norms() ? InitKind::zeros : InitKind::ones;
  norm.init_std = 0.0;
  norm.weight_decay = false;
  table.add(norm);
  if (!config.tie_word_embeddings) {
    ParamSpec head{"lm_head.weight", {V, D}};
    head.init = InitKind::normal;
    head.init_std = config.initializer_range;
    head.weight_decay = true;
    table.add(head);
  }
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) add_decoder_layer_params(table, config, layer);
  table.finalize(64);
  return table;
}

void check_tokens(const int32_t* tokens, const int32_t* targets, int64_t count, int64_t vocab) {
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

}  // namespace

template <class T>
Model<T>::Impl::Impl(const ModelConfig& c) : config(c) {
  check_buildable(config);
  table = build_param_table(config);
  dims = DecoderLayerDims::from_config(config);
  params = Buffer<T>(table.total_size());
  grads = Buffer<T>(table.total_size());
}

template <class T>
Model<T>::Model(const ModelConfig& config) : impl_(std::make_unique<Impl>(config)) {}
template <class T>
Model<T>::~Model() = default;

template <class T>
const ModelConfig& Model<T>::config() const { return impl_->config; }
template <class T>
const ParamTable& Model<T>::table() const { return impl_->table; }
template <class T>
T* Model<T>::params() { return impl_->params.data(); }
template <class T>
const T* Model<T>::params() const { return impl_->params.data(); }
template <class T>
T* Model<T>::grads() { return impl_->grads.data(); }
template <class T>
void Model<T>::init_weights(uint64_t seed) { init_parameters(impl_->table, impl_->params.data(), seed); }
template <class T>
void Model<T>::zero_grads() { impl_->grads.zero(); }

template <class T>
CrossEntropyResult Model<T>::Impl::forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                           bool save_activations) {
  Impl& m = *this;
  TRILLION_CHECK(batch > 0 && seq > 0, "batch ", batch, " and seq ", seq, " must be positive");
  const int64_t n = batch * seq, D = m.config.hidden_size, V = m.config.vocab_size;
  check_tokens(tokens, targets, n, V);
  m.store.clear();
  ensure_size(m.hidden, n * D);
  ensure_size(m.positions, n);
  for (int64_t i = 0; i < n; ++i) m.positions[i] = static_cast<int32_t>(i % seq);
  ActivationStore* store = save_activations ? &m.store : nullptr;
  T* params = m.params.data();
  T* x = m.hidden.data();  // [n, D]
  embedding_forward(x, m.embedding(params), tokens, n, D, V);
  for (int layer = 0; layer < m.config.num_hidden_layers; ++layer) {
    decoder_layer_forward(x, m.positions.data(), batch, seq, bind_decoder_layer(m.table, params, layer), m.dims,
                          store, layer, m.scratch);
  }
  m.scratch.reset();
  const auto buffer = [&](ActivationTag tag, int64_t count) {
    return save_or_scratch<T>(store, tag, 0, count, m.scratch);
  };
  T* final_input = buffer(ActivationTag::final_input, n * D);  // [n, D]
  std::memcpy(final_input, x, n * D * sizeof(T));
  T* rstd = buffer(ActivationTag::final_norm_rstd, n);   // [n]
  T* h = buffer(ActivationTag::final_norm_out, n * D);   // [n, D]
  rmsnorm_forward(h, rstd, final_input, m.final_norm(params), n, D, m.config.rms_norm_eps, m.config.zero_centred_norms());
  T* lse = buffer(ActivationTag::loss_lse, n);  // [n]
  return lm_head_cross_entropy_forward(lse, h, m.lm_head(params), targets, n, D, V);
}

// Forward only: nothing is saved, so its memory is one sublayer's, not every layer's.
template <class T>
CrossEntropyResult Model<T>::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq) {
  const CrossEntropyResult result = impl_->forward(tokens, targets, batch, seq, /*save_activations=*/false);
  impl_->scratch.reset();
  return result;
}

template <class T>
CrossEntropyResult Model<T>::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                              int64_t seq, double loss_scale) {
  Impl& m = *impl_;
  const CrossEntropyResult result = m.forward(tokens, targets, batch, seq, /*save_activations=*/true);
  const int64_t n = batch * seq, D = m.config.hidden_size, V = m.config.vocab_size;
  T* params = m.params.data();
  T* grads = m.grads.data();
  ensure_size(m.hidden_grad, n * D);
  T* dx = m.hidden_grad.data();  // [n, D] gradient of the residual stream
  {
    m.scratch.reset();
    const T* final_input = m.store.template get<T>(ActivationTag::final_input, 0, n * D);
    const T* rstd = m.store.template get<T>(ActivationTag::final_norm_rstd, 0, n);
    const T* h = m.store.template get<T>(ActivationTag::final_norm_out, 0, n * D);
    const T* lse = m.store.template get<T>(ActivationTag::loss_lse, 0, n);
    T* dh = m.scratch.template alloc<T>(n * D);  // [n, D]
    // Tied head: its dw lands in the embedding gradient, which embedding_backward adds to below.
    lm_head_cross_entropy_backward(dh, m.lm_head(grads), h, m.lm_head(params), targets, lse, loss_scale, n, D, V);
    rmsnorm_backward(dx, m.final_norm(grads), dh, final_input, m.final_norm(params), rstd, n, D,
                     m.config.zero_centred_norms(), /*accumulate_dx=*/false);
  }
  for (int layer = static_cast<int>(m.config.num_hidden_layers) - 1; layer >= 0; --layer) {
    decoder_layer_backward(dx, m.positions.data(), batch, seq, bind_decoder_layer(m.table, params, layer),
                           bind_decoder_layer(m.table, grads, layer), m.dims, m.store, layer, m.scratch);
  }
  embedding_backward(m.embedding(grads), dx, tokens, n, D, V);
  m.store.clear();
  m.scratch.reset();
  return result;
}

template <class T>
void Model<T>::start_generation(int64_t max_len) {
  Impl& m = *impl_;
  if (max_len <= 0) fail("generation length ", max_len, " must be positive");
  const int64_t per_layer = max_len * m.dims.attn.kv_width();  // [max_len, Hkv, d]
  m.k_cache.clear();
  m.v_cache.clear();
  for (int layer = 0; layer < m.config.num_hidden_layers; ++layer) {
    m.k_cache.emplace_back(per_layer);
    m.v_cache.emplace_back(per_layer);
  }
  m.cache_capacity = max_len;
  m.cache_length = 0;
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
    decoder_layer_decode(x, n, m.cache_length, m.k_cache[layer].data(), m.v_cache[layer].data(),
                         bind_decoder_layer(m.table, params, layer), m.dims, m.scratch);
  }
  m.scratch.reset();
  T* h = m.scratch.template alloc<T>(D);  // [1, D] final-normed last token
  T* rstd = m.scratch.template alloc<T>(1);  // [1]
  rmsnorm_forward(h, rstd, x + (n - 1) * D, m.final_norm(params), 1, D, m.config.rms_norm_eps,
                  m.config.zero_centred_norms());
  linear_forward(last_logits, h, m.lm_head(params), 1, D, V);  // [1, V]
  m.cache_length += n;
  m.scratch.reset();
}

// 6 · (matmul parameters, LM head included even when tied) for the weight matmuls (forward 2,
// backward 4), plus per layer 3 · 4 · (seq / 2) · Hq · d for causal attention (QKᵀ and PV, 2 FLOPs
// per multiply-add each, over seq / 2 keys on average; backward twice the forward).
template <class T>
double Model<T>::training_flops_per_token(int64_t seq) const {
  const Impl& m = *impl_;
  const AttentionBlockDims& a = m.dims.attn;
  const double D = double(m.config.hidden_size), I = double(m.config.intermediate_size);
  const double layer_matmul = D * double(a.q_proj_out() + 2 * a.kv_width()) + double(a.q_width()) * D + 3.0 * D * I;
  const double matmul_params = double(m.config.num_hidden_layers) * layer_matmul + double(m.config.vocab_size) * D;
  const double attention = double(m.config.num_hidden_layers) * 3.0 * 4.0 * (double(seq) / 2.0) *
                           double(a.q_heads) * double(a.head_dim);
  return 6.0 * matmul_params + attention;
}

template class Model<float>;
template class Model<double>;

}  // namespace trillion
