// Model<T>: parameter table, layer stack, final norm, fused LM-head cross-entropy. Generation with
// a decode cache is in generation.cpp, checkpoints in weights.cpp, the forward's statistics and
// router losses in model_statistics.cpp.
#include "model/model.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/machine_memory.h"
#include "model/family.h"
#include "model/model_impl.h"
#include "model/sublayer_input.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "model/linear.h"
#include "ops/norm.h"

namespace trillion {
namespace {

std::string source_of(const ModelConfig& config) { return config.source.empty() ? "config" : config.source; }

// Rejects layer kinds the config describes but the engine does not declare (linear attention
// outside qwen3_next's Gated DeltaNet and kimi_linear's KDA), naming the file: they can be neither
// built nor counted.
void check_kinds_declared(const ModelConfig& config) {
  const std::string source = source_of(config);
  const bool linear_built = family_of(config.model_type).linear_attention != LinearAttention::none;
  for (size_t i = 0; i < config.layer_types.size(); ++i) {
    const LayerType type = config.layer_types[i];
    const bool built = type != LayerType::linear_attention || linear_built;
    if (!built)
      fail(source, ": layer_types[", i, "] = ", layer_type_name(type), ": not built yet",
           " for " + config.model_type + " (built: qwen3_next's Gated DeltaNet, kimi_linear's KDA)");
  }
}

// Rejects what the config can describe but the engine does not build yet.
void check_buildable(const ModelConfig& config) {
  check_kinds_declared(config);
  if (!family_of(config.model_type).mla && (config.rotary_dim() <= 0 || config.rotary_dim() % 2 != 0))
    fail(source_of(config), ": field \"partial_rotary_factor\": gives rotary dimension ", config.rotary_dim(),
         " of head_dim ", config.head_dim,
         ": not built; expected partial_rotary_factor · head_dim to be a positive even number");
  TRILLION_CHECK(static_cast<int64_t>(config.layer_types.size()) == config.num_hidden_layers &&
                     static_cast<int64_t>(config.mlp_layer_types.size()) == config.num_hidden_layers,
                 "layer_types / mlp_layer_types do not have ", config.num_hidden_layers, " entries");
}

std::vector<DecoderLayerDims> layer_dims_of(const ModelConfig& config) {
  std::vector<DecoderLayerDims> dims;
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) dims.push_back(DecoderLayerDims::from_config(config, layer));
  return dims;
}

// Units as unit_order states them. Embeddings and norms have no weight decay; projections (the
// untied LM head included) do. With LoRA (config.lora), the targeted layers' adapters.
ParamTable build_param_table(const ModelConfig& config, const std::vector<DecoderLayerDims>& layer_dims) {
  ParamTable table;
  const int64_t V = config.vocab_size, D = config.hidden_size;
  const int head = head_unit(config);
  ParamRow embedding = make_row("model.embed_tokens.weight", {V, D}, InitKind::normal, config.initializer_range, false);
  embedding.use = config.tie_word_embeddings ? ParamUse::values_and_products : ParamUse::values;  // (the head)
  const LoraConfig* lora = config.lora.get();
  if (lora != nullptr && config.tie_word_embeddings && (lora->saves_module("model.embed_tokens") || lora->saves_module(kOutputLayer)))
    fail(lora->source, ": field \"modules_to_save\": matches the embeddings, tied to the LM head in ",
         source_of(config), "; expected untied embeddings");
  add_row(table, "", 0, lora_saved_row(lora, "", embedding));
  add_row(table, "", head, lora_saved_row(lora, "", norm_row("model.norm.weight", D, final_norm_spec(config))));
  if (!config.tie_word_embeddings)
    add_row(table, "", head, lora_saved_row(lora, "", linear_row("lm_head.weight", {V, D}, config.initializer_range)));
  for (int layer = 0; layer < config.num_hidden_layers; ++layer)
    add_decoder_layer_params(table, layer_dims[layer], layer, lora);
  if (lora != nullptr) freeze_base_for_lora(*lora, table, source_of(config));
  table.finalize(64);
  return table.with_checkpoint_renames(family_of(config.model_type).checkpoint_renames);
}

void call(const std::function<void(int)>& hook, int unit) {
  if (hook) hook(unit);
}

}  // namespace

int head_unit(const ModelConfig& config) { return config.tie_word_embeddings ? 0 : 1 + config.num_hidden_layers; }

UnitOrder unit_order(const ModelConfig& config) {
  UnitOrder order;
  const int layers = config.num_hidden_layers, head = head_unit(config);
  for (int unit = 0; unit <= layers; ++unit) order.forward.push_back(unit);
  order.backward.push_back(head);
  for (int unit = layers; unit >= 1; --unit) order.backward.push_back(unit);
  if (head != 0) {
    order.forward.push_back(head);
    order.backward.push_back(0);
  }
  return order;
}

std::vector<SavedTensor> head_saved_tensors(int64_t tokens, int64_t hidden, bool gradients_in_forward) {
  std::vector<SavedTensor> list = input_saved_tensors(kHeadInput, tokens, hidden, head_input_use(gradients_in_forward));
  if (gradients_in_forward)
    list.push_back({ActivationTag::loss_dh, {tokens, hidden}});  // [n, D]
  else
    list.push_back({ActivationTag::loss_lse, {tokens}});  // [n]
  return list;
}

ParamTable param_table_of(const ModelConfig& config) {
  check_kinds_declared(config);
  return build_param_table(config, layer_dims_of(config));
}

ParamCounts count_parameters(const ModelConfig& config) { return count_parameters(config, param_table_of(config)); }

ParamCounts count_parameters(const ModelConfig& config, const ParamTable& table) {
  ParamCounts counts;
  counts.dense = table.num_elements(ParamGroup::dense);
  counts.expert = table.num_elements(ParamGroup::expert);
  counts.buffer = table.num_elements(ParamGroup::buffer);
  counts.total = counts.dense + counts.expert;
  counts.storage = table.total_size();
  counts.trainable_storage = table.trainable_size();
  counts.sharded_storage = table.sharded_size();
  for (const ParamSpec& spec : table.entries()) counts.trainable += spec.trainable() ? spec.numel() : 0;
  counts.with_adapters = table.num_elements() - counts.buffer;
  counts.active = counts.dense;
  if (config.num_experts > 0)
    counts.active += counts.expert / config.num_experts * config.num_experts_per_tok;
  return counts;
}

template <class T>
Model<T>::Impl::Impl(const ModelConfig& c) : config(c) {
  check_buildable(config);
  layer_dims = layer_dims_of(config);
  table = build_param_table(config, layer_dims);
  const int64_t param_bytes = table.total_size() * int64_t(sizeof(T)), grad_bytes = table.trainable_size() * int64_t(sizeof(T));
  require_memory(param_bytes + grad_bytes, source_of(config) + ": the model",
                 str_cat(" for its parameters (", human_bytes(double(param_bytes)), ") and gradients (",
                         human_bytes(double(grad_bytes)), ")"),
                 "smaller sizes in the model config");
  params = Buffer<T>(table.total_size());
  grads = Buffer<T>(table.trainable_size());
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    layer_params.push_back(
        bind_decoder_layer(table, params.data(), /*gradients=*/false, layer_dims[layer], layer, config.lora.get()));
    layer_grads.push_back(
        bind_decoder_layer(table, grads.data(), /*gradients=*/true, layer_dims[layer], layer, config.lora.get()));
  }
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
void Model<T>::init_weights(uint64_t seed) {
  impl_->restore_base();
  init_parameters(impl_->table, impl_->params.data(), seed);
}
template <class T>
void Model<T>::zero_grads() { impl_->grads.zero(); }
template <class T>
DecisionLog& Model<T>::decisions() { return impl_->decisions; }
template <class T>
void Model<T>::set_unit_hooks(UnitHooks hooks) { impl_->hooks = std::move(hooks); }
template <class T>
void Model<T>::set_lora_dropout(const std::optional<LoraDropoutPass>& pass) {
  impl_->lora_dropout = pass;
}

template <class T>
void Model<T>::set_expert_exchange(ExpertExchange* exchange) {
  impl_->exchange = exchange;
}
template <class T>
void Model<T>::set_context_exchange(ContextExchange* context) {
  impl_->context = context;
}
template <class T>
void Model<T>::set_statistics_reduction(StatisticsReduction reduction) {
  impl_->reduction = std::move(reduction);
}

template <class T>
std::vector<std::pair<int, T*>> Model<T>::correction_biases() {
  std::vector<std::pair<int, T*>> biases;
  for (int layer = 0; layer < impl_->config.num_hidden_layers; ++layer) {
    const auto* moe = std::get_if<MoeWeights<T>>(&impl_->layer_params[layer].ffn);
    if (moe != nullptr && moe->correction_bias != nullptr) biases.emplace_back(layer, moe->correction_bias);
  }
  return biases;
}

template <class T>
StepResult Model<T>::Impl::forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                   PassMode mode, const LossScales& scales) {
  Impl& m = *this;
  TRILLION_CHECK(batch > 0 && seq > 0, "batch ", batch, " and seq ", seq, " must be positive");
  TRILLION_CHECK(mode == PassMode::train || mode == PassMode::eval, "a model forward is a train or eval pass");
  const int64_t n = batch * seq, D = m.config.hidden_size, V = m.config.vocab_size;
  check_tokens(tokens, targets, n, V);
  m.refresh_bf16_params();
  m.store.clear();
  if (!m.decisions.replaying()) m.decisions.start_recording();
  ensure_size(m.hidden, n * D);
  ensure_size(m.positions, n);
  // Under context parallelism training and evaluation passes take this rank's part of each sequence
  // (every rank of its group runs them).
  ContextExchange* context = m.context;
  const int32_t* global = context != nullptr ? context->positions(seq) : nullptr;  // [seq]
  if (m.document_eos >= 0 && context != nullptr) {
    // Documents span the ranks' chunks: their starts as global positions, no packed segments (the
    // linear-attention layers hand the starts to the exchange).
    ensure_size(m.doc_start, n);
    context->document_starts(m.doc_start.data(), tokens, batch, m.document_eos);
    m.cu_seqlens.clear();
    for (int64_t i = 0; i < n; ++i) m.positions[i] = global[i % seq] - m.doc_start[i];
  } else if (m.document_eos >= 0) {  // a document starts at each row's start and after each eos
    ensure_size(m.doc_start, n);
    m.cu_seqlens.clear();
    for (int64_t b = 0; b < batch; ++b) {
      int32_t start = 0;
      for (int64_t t = 0; t < seq; ++t) {
        if (t > 0 && tokens[b * seq + t - 1] == m.document_eos) start = static_cast<int32_t>(t);
        if (t == start) m.cu_seqlens.push_back(static_cast<int32_t>(b * seq + t));
        m.doc_start[b * seq + t] = start;
        m.positions[b * seq + t] = static_cast<int32_t>(t) - start;
      }
    }
    m.cu_seqlens.push_back(static_cast<int32_t>(n));
  } else {
    for (int64_t i = 0; i < n; ++i)
      m.positions[i] = global != nullptr ? global[i % seq] : static_cast<int32_t>(i % seq);
  }
  StepResult result;
  LayerPass pass(mode, batch, seq);
  pass.positions = m.positions.data();
  m.document_segments(pass);
  pass.store = pass.saves() ? &m.store : nullptr;
  pass.decisions = &m.decisions;
  pass.result = &result;
  const int sparse = m.sparse_layers();
  // The shares the statistics are over: a training step's, or this rank's batch alone.
  const StatisticsReduction one_share, &shares = mode == PassMode::train ? m.reduction : one_share;
  m.indexer.grad_scale = sparse > 0 ? m.indexer.coef * scales.aux / sparse * shares.token_weight() : 0.0;
  pass.indexer = &m.indexer;
  pass.experts = m.exchange;
  pass.context = context;
  T* params = m.params.data();
  T* x = m.hidden.data();  // [n, D]
  const int head_fsdp_unit = head_unit(m.config);  // 0 (tied: the embeddings' unit) or 1 + L
  call(m.hooks.before_forward, 0);
  embedding_forward(x, m.embedding(params), tokens, n, D, V);
  if (head_fsdp_unit != 0) call(m.hooks.after_forward, 0);
  for (int layer = 0; layer < m.config.num_hidden_layers; ++layer) {
    call(m.hooks.before_forward, 1 + layer);
    const bool last = layer + 1 == m.config.num_hidden_layers;  // its backward comes right after the head
    mixer_sublayer_forward(x, m.layer_params[layer], m.layer_dims[layer], pass, layer, m.scratch);
    m.check_output(result, x, n * D, layer, "mixer");
    if (pass.saves()) pass.store->end_forward(layer, TagSublayer::mixer, /*backward_next=*/last);
    ffn_sublayer_forward(x, m.layer_params[layer], m.layer_dims[layer], pass, layer, m.scratch);
    if (layer == m.nan_after_layer) x[0] = std::numeric_limits<T>::quiet_NaN();
    m.check_output(result, x, n * D, layer, "FFN");
    if (pass.saves()) pass.store->end_forward(layer, TagSublayer::ffn, /*backward_next=*/last);
    call(m.hooks.after_forward, 1 + layer);
  }
  m.scratch.reset();
  if (pass.saves()) pass.store->release_free_pages();
  const int head = static_cast<int>(m.config.num_hidden_layers);  // the head's entries: layer L
  if (head_fsdp_unit != 0) call(m.hooks.before_forward, head_fsdp_unit);
  const bool gradients_in_forward = mode == PassMode::train && m.loss_gradients == LossGradients::in_forward;
  const SavedWriter saves(head_saved_tensors(n, D, gradients_in_forward), pass.store, head, m.scratch);
  const T* h = sublayer_input_forward(x, m.final_norm(params), final_norm_spec(m.config), kHeadInput,
                                      head_input_use(gradients_in_forward), D, pass, head, m.scratch);  // [n, D]
  if (gradients_in_forward) {
    // The loss scale is known: the gradient wrt h is formed now, tile by tile, and the head's
    // weight gradient accumulated (tied: into the embedding's, which embedding_backward adds to).
    T* dh = saves.out<T>(ActivationTag::loss_dh);  // [n, D]
    call(m.hooks.before_gradients, head_fsdp_unit);
    result.lm = lm_head_cross_entropy_forward_backward(dh, m.lm_head_grad(), static_cast<T*>(nullptr), h,
                                                       m.lm_head(params), targets, scales.lm, 0.0, n, D, V);
  } else {
    T* lse = saves.out<T>(ActivationTag::loss_lse);  // [n]
    result.lm = lm_head_cross_entropy_forward(lse, h, m.lm_head(params), targets, n, D, V);
  }
  if (pass.saves()) pass.store->end_forward(head, TagSublayer::head, /*backward_next=*/true);
  call(m.hooks.after_forward, head_fsdp_unit);
  if (shares.combines()) m.reduce_statistics(result);
  m.add_router_losses(result, shares.batch_tokens(n));
  m.add_indexer_loss(result);
  return result;
}

template <class T>
void Model<T>::set_indexer_training(IndexerMode mode, double coef) {
  if (coef < 0.0) fail("indexer loss coefficient ", coef, " must be non-negative");
  impl_->indexer.mode = mode;
  impl_->indexer.coef = coef;
}

template <class T>
void Model<T>::set_check_numerics(bool on) {
  impl_->check_numerics = on;
}

template <class T>
void Model<T>::inject_nan_after_layer(int layer) {
  impl_->nan_after_layer = layer;
}

template <class T>
void Model<T>::Impl::check_output(StepResult& result, const T* x, int64_t count, int layer, const char* sublayer) const {
  if (!check_numerics || !result.first_nonfinite_output.empty()) return;
  if (std::all_of(x, x + count, [](T value) { return std::isfinite(value); })) return;
  result.first_nonfinite_output = str_cat("layer ", layer, " (", layer_type_name(config.layer_types[layer]), ") ",
                                          sublayer, " output");
}

template <class T>
void Model<T>::set_document_mask(int32_t eos_id) {
  Impl& m = *impl_;
  if (eos_id >= m.config.vocab_size) fail("document masks: eos id ", eos_id, " outside the vocab ", m.config.vocab_size);
  m.document_eos = eos_id;
}

template <class T>
void Model<T>::set_loss_gradients(LossGradients mode) {
  impl_->loss_gradients = mode;
}

template <class T>
int Model<T>::Impl::sparse_layers() const {
  return static_cast<int>(config.sparse_layers());
}

template <class T>
int Model<T>::sparse_layers() const {
  return impl_->sparse_layers();
}

// Forward only: nothing is saved, so its memory is one sublayer's, not every layer's.
template <class T>
StepResult Model<T>::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq) {
  const LoraDropoutScope dropout(impl_->lora_dropout ? &*impl_->lora_dropout : nullptr);
  StepResult result = impl_->forward(tokens, targets, batch, seq, PassMode::eval, LossScales{});
  impl_->scratch.reset();
  return result;
}

template <class T>
StepResult Model<T>::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                      const LossScales& scales) {
  Impl& m = *impl_;
  const LoraDropoutScope dropout(m.lora_dropout ? &*m.lora_dropout : nullptr);
  const StepResult result = m.forward(tokens, targets, batch, seq, PassMode::train, scales);
  const int64_t n = batch * seq, D = m.config.hidden_size, V = m.config.vocab_size;
  T* params = m.params.data();
  ensure_size(m.hidden_grad, n * D);
  T* dx = m.hidden_grad.data();  // [n, D] gradient of the residual stream
  const int head = static_cast<int>(m.config.num_hidden_layers);  // the head's entries: layer L
  const int head_fsdp_unit = head_unit(m.config);
  LayerPass pass(PassMode::train, batch, seq);  // the backward of the training forward
  pass.positions = m.positions.data();
  m.document_segments(pass);
  pass.indexer = &m.indexer;
  call(m.hooks.before_backward, head_fsdp_unit);
  call(m.hooks.before_gradients, head_fsdp_unit);
  m.store.begin_backward(head, TagSublayer::head);
  {
    m.scratch.reset();
    const bool gradients_in_forward = m.store.contains(ActivationTag::loss_dh, head);
    const SublayerInput<T> in =
        saved_sublayer_input<T>(kHeadInput, head_input_use(gradients_in_forward), D, pass, m.store, head);
    const SavedReader saved(head_saved_tensors(n, D, gradients_in_forward), m.store, head);
    const T* dh = nullptr;  // [n, D] gradient wrt the final norm's output
    if (gradients_in_forward) {
      dh = saved.in<T>(ActivationTag::loss_dh);  // formed in the forward
    } else {
      const T* lse = saved.in<T>(ActivationTag::loss_lse);  // [n]
      T* recomputed = m.scratch.template alloc<T>(n * D);  // [n, D]
      // Tied head: its dw lands in the embedding gradient, which embedding_backward adds to below.
      lm_head_cross_entropy_backward(recomputed, m.lm_head_grad(), in.h, m.lm_head(params), targets, lse, scales.lm, n,
                                     D, V);
      dh = recomputed;
    }
    sublayer_input_backward(dx, m.final_norm_grad(), dh, in, m.final_norm(params), final_norm_spec(m.config), n, D,
                            /*accumulate=*/false);
  }
  m.store.end_backward(head, TagSublayer::head);
  if (head_fsdp_unit != 0) call(m.hooks.after_backward, head_fsdp_unit);
  pass.experts = m.exchange;
  pass.context = m.context;
  for (int layer = static_cast<int>(m.config.num_hidden_layers) - 1; layer >= 0; --layer) {
    call(m.hooks.before_backward, 1 + layer);
    call(m.hooks.before_gradients, 1 + layer);
    m.store.begin_backward(layer, TagSublayer::ffn);
    m.recompute(layer, batch, seq);
    MoeBalanceGrad balance;
    if (m.layer_dims[layer].is_moe()) {
      balance = m.balance_grad(result, layer, m.reduction.batch_tokens(n), scales.aux);
    }
    pass.balance = &balance;
    ffn_sublayer_backward(dx, m.layer_params[layer], m.layer_grads[layer], m.layer_dims[layer], pass, m.store, layer,
                          m.scratch);
    m.store.end_backward(layer, TagSublayer::ffn);
    m.store.begin_backward(layer, TagSublayer::mixer);
    mixer_sublayer_backward(dx, m.layer_params[layer], m.layer_grads[layer], m.layer_dims[layer], pass, m.store, layer,
                            m.scratch);
    m.store.end_backward(layer, TagSublayer::mixer);
    call(m.hooks.after_backward, 1 + layer);
  }
  if (head_fsdp_unit != 0) call(m.hooks.before_backward, 0);
  call(m.hooks.before_gradients, 0);
  if (T* embedding_grad = m.embedding_grad()) embedding_backward(embedding_grad, dx, tokens, n, D, V);
  call(m.hooks.after_backward, 0);
  m.store.clear();
  m.scratch.reset();
  return result;
}

template <class T>
void Model<T>::Impl::recompute(int layer, int64_t batch, int64_t seq) {
  const bool mixer = store.reruns(layer, TagSublayer::mixer);
  const bool ffn = store.reruns(layer, TagSublayer::ffn);
  if (!mixer && !ffn) return;
  const int64_t n = batch * seq, D = config.hidden_size;
  ensure_size(recompute_hidden, n * D);
  T* x = recompute_hidden.data();  // [n, D]
  const ActivationTag start = (mixer ? kMixerInput : kFfnInput).input;  // [n, D] the checkpoint
  std::memcpy(x, store.template get<T>(start, layer, n * D), n * D * sizeof(T));
  StepResult discarded;  // routing statistics and losses were reported by the forward
  LayerPass pass(PassMode::recompute, batch, seq);
  pass.positions = positions.data();
  document_segments(pass);
  pass.store = &store;
  pass.decisions = &decisions;
  pass.result = &discarded;
  pass.indexer = &indexer;
  pass.experts = exchange;  // the FFN's re-run does not exchange (model/moe.cpp)
  pass.context = context;
  // Which sublayers re-run depends on tensor sizes, which differ between the ranks of a context-
  // parallel group when their chunks do; a re-run mixer's gathers would then meet no partner.
  TRILLION_CHECK(context == nullptr || !mixer, "context parallelism with recomputed mixers: not yet (layer ", layer,
                 ")");
  const bool was_replaying = decisions.replaying();
  decisions.start_replay();  // never re-route, never re-select
  store.begin_recompute(layer);
  if (mixer) mixer_sublayer_forward(x, layer_params[layer], layer_dims[layer], pass, layer, scratch);
  if (ffn) ffn_sublayer_forward(x, layer_params[layer], layer_dims[layer], pass, layer, scratch);
  store.end_recompute();
  if (!was_replaying) decisions.stop_replay();
  scratch.reset();
}

template <class T>
ActivationStore& Model<T>::activations() {
  return impl_->store;
}
template <class T>
void Model<T>::reset_workspace() {
  impl_->scratch.reset();
}

template <class T>
double Model<T>::training_flops_per_token(int64_t seq) const {
  return training_flops_of(impl_->config, impl_->table, seq).per_token;
}

template class Model<float>;
template class Model<double>;

}  // namespace trillion
