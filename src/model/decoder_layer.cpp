// Decoder layer: the kinds chosen per layer, their parameters declared and bound from one list,
// and the two sublayers chained with the FFN's input norm and residual. See decoder_layer.h.
#include "model/decoder_layer.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/phase_clock.h"
#include "model/family.h"
#include "model/sublayer_input.h"
#include "ops/norm.h"

namespace trillion {

DecoderLayerDims DecoderLayerDims::from_config(const ModelConfig& config, int layer) {
  const Family family = family_of(config.model_type);
  const LayerType type = config.layer_types[layer];
  DecoderLayerDims dims;
  dims.hidden = config.hidden_size;
  dims.mixer_norm = {config.rms_norm_eps, family.zero_centred_norms};
  if (type == LayerType::linear_attention && family.linear_attention == LinearAttention::kimi_delta) {
    dims.mixer = KimiDeltaAttentionDims::from_config(config);
  } else if (type == LayerType::linear_attention) {
    dims.mixer = GatedDeltaNetDims::from_config(config);  // the family's (model.cpp's check_kinds_declared)
  } else if (family.mla) {
    dims.mixer = MlaDims::from_config(config, layer, type == LayerType::sparse_attention);
  } else {
    dims.mixer = AttentionBlockDims::from_config(config, type == LayerType::sparse_attention);
  }
  dims.ffn_norm = {config.rms_norm_eps, family.zero_centred_norms};
  if (config.is_moe_layer(layer)) {
    dims.ffn = MoeDims::from_config(config);
  } else {
    MlpDims mlp;
    mlp.hidden = config.hidden_size;
    mlp.intermediate = config.intermediate_size;
    mlp.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
    dims.ffn = mlp;
  }
  return dims;
}

double DecoderLayerDims::flops_per_token(int64_t seq) const {
  return mixer_flops_per_token(seq) + ffn_flops_per_token(seq);
}

double DecoderLayerDims::mixer_flops_per_token(int64_t seq) const {
  return std::visit([&](const auto& d) { return trillion::flops_per_token(d, seq); }, mixer);
}

double DecoderLayerDims::ffn_flops_per_token(int64_t seq) const {
  return std::visit([&](const auto& d) { return trillion::flops_per_token(d, seq); }, ffn);
}

double DecoderLayerDims::context_flops_per_token(int64_t seq) const {
  return std::visit([&](const auto& d) { return trillion::context_flops_per_token(d, seq); }, mixer);
}

InputUse DecoderLayerDims::mixer_input_use() const {
  return std::visit([](const auto& d) { return input_use(d); }, mixer);
}

InputUse DecoderLayerDims::ffn_input_use() const {
  return std::visit([](const auto& d) { return input_use(d); }, ffn);
}

std::vector<SavedSize> DecoderLayerDims::saved_sizes(const StepShape& shape) const {
  const SavedExtent extent = shape.extent();
  const auto of_kind = [&](const auto& d) { return saved_tensors(d, extent); };
  std::vector<SavedTensor> list = input_saved_tensors(kMixerInput, extent.tokens(), hidden, mixer_input_use());
  for (const auto& part : {std::visit(of_kind, mixer),
                           input_saved_tensors(kFfnInput, extent.tokens(), hidden, ffn_input_use()),
                           std::visit(of_kind, ffn)})
    list.insert(list.end(), part.begin(), part.end());
  return trillion::saved_sizes(list, shape.element_bytes, shape.bf16_operands);
}

// The FFN's backward runs with dh [n, D] already in the scratch (ffn_sublayer_backward), and the FFN
// norm's backward after it with the FFN's scratch still held (bounded by its backward's workspace).
LayerWorkspace DecoderLayerDims::workspace_bytes(const StepShape& shape) const {
  const auto of_kind = [&](const auto& d) { return trillion::workspace_bytes(d, shape); };
  const Workspace m = std::visit(of_kind, mixer), f = std::visit(of_kind, ffn);
  const int64_t dh = Arena::rounded(shape.tokens() * hidden * shape.element_bytes);
  const int64_t ffn_norm = rmsnorm_backward_workspace_bytes(shape.tokens(), hidden, /*has_dw=*/true);
  return {m.forward, f.forward, dh + f.backward + ffn_norm, m.backward};
}

ContextTraffic DecoderLayerDims::context_traffic(const StepShape& shape) const {
  return std::visit([&](const auto& d) { return trillion::context_traffic(d, shape); }, mixer);
}

int64_t DecoderLayerDims::decode_cache_elements(int64_t max_len) const {
  return std::visit([&](const auto& d) { return cache_elements(d, max_len); }, mixer);
}

std::string decoder_layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

namespace {

// Calls f(kind dims, kind weights…) with, from each weights variant, the alternative that belongs
// to the kind `dims` holds (each kind's Dims::Weights<T>).
template <class T, class DimsVariant, class F, class... WeightsVariants>
void with_kind(const DimsVariant& dims, F&& f, WeightsVariants&... weights) {
  std::visit(
      [&](const auto& d) {
        using Kind = typename std::decay_t<decltype(d)>::template Weights<T>;
        f(d, std::get<Kind>(weights)...);
      },
      dims);
}

// Makes `weights` hold the alternative of the kind `dims` holds.
template <class T, class DimsVariant, class WeightsVariant>
void select_kind(const DimsVariant& dims, WeightsVariant& weights) {
  std::visit([&](const auto& d) { weights.template emplace<typename std::decay_t<decltype(d)>::template Weights<T>>(); },
             dims);
}

}  // namespace

// The layer's tensors: the input norm, its mixer's, the FFN norm, its FFN's (each kind's visit_params).
template <class T, class Visit>
void visit_params(DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, Visit&& visit) {
  visit(w.input_norm, norm_row("input_layernorm.weight", dims.hidden, dims.mixer_norm));
  select_kind<T>(dims.mixer, w.mixer);
  with_kind<T>(dims.mixer, [&](const auto& d, auto& kind) { visit_params(kind, d, visit); }, w.mixer);
  visit(w.ffn_norm, norm_row("post_attention_layernorm.weight", dims.hidden, dims.ffn_norm));
  select_kind<T>(dims.ffn, w.ffn);
  with_kind<T>(dims.ffn, [&](const auto& d, auto& kind) { visit_params(kind, d, visit); }, w.ffn);
}

void add_decoder_layer_params(ParamTable& table, const DecoderLayerDims& dims, int layer, const LoraConfig* lora) {
  declare_rows<DecoderLayerWeights<float>>(table, decoder_layer_prefix(layer), 1 + layer, dims, lora);
}

template <class T>
DecoderLayerWeights<T> bind_decoder_layer(const ParamTable& table, T* base, bool gradients,
                                          const DecoderLayerDims& dims, int layer, const LoraConfig* lora) {
  DecoderLayerWeights<T> w;
  bind_rows(w, table, decoder_layer_prefix(layer), base, gradients, dims, lora);
  return w;
}


template <class T>
void mixer_sublayer_forward(T* x, const DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, const LayerPass& pass,
                            int layer, Arena& scratch) {
  PhaseScope scope(Phase::attention);
  scratch.reset();
  const T* h = sublayer_input_forward(x, w.input_norm, dims.mixer_norm, kMixerInput, dims.mixer_input_use(), dims.hidden,
                                      pass, layer, scratch);
  with_kind<T>(dims.mixer, [&](const auto& d, const auto& kind) { mixer_forward(x, h, kind, d, pass, layer, scratch); },
               w.mixer);
}

template <class T>
void ffn_sublayer_forward(T* x, const DecoderLayerWeights<T>& w, const DecoderLayerDims& dims, const LayerPass& pass,
                          int layer, Arena& scratch) {
  PhaseScope scope(Phase::elementwise);  // the MLP's and MoE's own scopes inside
  scratch.reset();
  const T* h = sublayer_input_forward(x, w.ffn_norm, dims.ffn_norm, kFfnInput, dims.ffn_input_use(), dims.hidden, pass,
                                      layer, scratch);
  with_kind<T>(dims.ffn, [&](const auto& d, const auto& kind) { ffn_forward(x, h, kind, d, pass, layer, scratch); },
               w.ffn);
}

template <class T>
void ffn_sublayer_backward(T* dx, const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                           const DecoderLayerDims& dims, const LayerPass& pass, const ActivationStore& store, int layer,
                           Arena& scratch) {
  PhaseScope scope(Phase::elementwise);  // the MLP's and MoE's own scopes inside
  const int64_t n = pass.batch * pass.seq, D = dims.hidden;
  scratch.reset();
  const SublayerInput<T> in = saved_sublayer_input<T>(kFfnInput, dims.ffn_input_use(), D, pass, store, layer);
  T* dh = scratch.alloc<T>(n * D);  // [n, D] gradient wrt the FFN's normed input (zero-filled)
  with_kind<T>(
      dims.ffn,
      [&](const auto& d, const auto& kind, const auto& kind_grads) {
        ffn_backward(dh, dx, in.h, kind, kind_grads, d, pass, store, layer, scratch);
      },
      w.ffn, grads.ffn);
  sublayer_input_backward(dx, grads.ffn_norm, dh, in, w.ffn_norm, dims.ffn_norm, n, D, /*accumulate=*/true);
  scratch.reset();
}

template <class T>
void mixer_sublayer_backward(T* dx, const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                             const DecoderLayerDims& dims, const LayerPass& pass, const ActivationStore& store,
                             int layer, Arena& scratch) {
  PhaseScope scope(Phase::attention);
  const int64_t n = pass.batch * pass.seq, D = dims.hidden;
  scratch.reset();
  const SublayerInput<T> in = saved_sublayer_input<T>(kMixerInput, dims.mixer_input_use(), D, pass, store, layer);
  const T* dh = nullptr;  // [n, D] gradient wrt the mixer's normed input, in its scratch
  with_kind<T>(
      dims.mixer,
      [&](const auto& d, const auto& kind, const auto& kind_grads) {
        dh = mixer_backward(dx, in.h, kind, kind_grads, d, pass, store, layer, scratch);
      },
      w.mixer, grads.mixer);
  sublayer_input_backward(dx, grads.input_norm, dh, in, w.input_norm, dims.mixer_norm, n, D, /*accumulate=*/true);
}

template <class T>
void decoder_layer_decode(T* x, int64_t n, int64_t past, int64_t max_len, T* cache, const DecoderLayerWeights<T>& w,
                          const DecoderLayerDims& dims, Arena& scratch) {
  const int64_t D = dims.hidden;
  const auto normed = [&](const T* weight, const NormSpec& norm) {
    scratch.reset();
    T* rstd = scratch.alloc<T>(n);   // [n]
    T* h = scratch.alloc<T>(n * D);  // [n, D]
    rmsnorm_forward(h, rstd, x, weight, n, D, norm.eps, norm.zero_centred);
    return h;
  };
  const T* h = normed(w.input_norm, dims.mixer_norm);  // [n, D]
  with_kind<T>(
      dims.mixer,
      [&](const auto& d, const auto& kind) { mixer_decode(x, h, n, past, max_len, cache, kind, d, scratch); },
      w.mixer);
  h = normed(w.ffn_norm, dims.ffn_norm);
  const LayerPass pass(PassMode::decode, 1, n);
  with_kind<T>(dims.ffn, [&](const auto& d, const auto& kind) { ffn_forward(x, h, kind, d, pass, 0, scratch); }, w.ffn);
}

#define TRILLION_INSTANTIATE(T)                                                                                  \
  template DecoderLayerWeights<T> bind_decoder_layer<T>(const ParamTable&, T*, bool, const DecoderLayerDims&, int,     \
                                                       const LoraConfig*);                                          \
  template void mixer_sublayer_forward<T>(T*, const DecoderLayerWeights<T>&, const DecoderLayerDims&,            \
                                          const LayerPass&, int, Arena&);                                        \
  template void ffn_sublayer_forward<T>(T*, const DecoderLayerWeights<T>&, const DecoderLayerDims&,              \
                                        const LayerPass&, int, Arena&);                                          \
  template void ffn_sublayer_backward<T>(T*, const DecoderLayerWeights<T>&, const DecoderLayerWeights<T>&,       \
                                         const DecoderLayerDims&, const LayerPass&, const ActivationStore&, int,  \
                                         Arena&);                                                                \
  template void mixer_sublayer_backward<T>(T*, const DecoderLayerWeights<T>&, const DecoderLayerWeights<T>&,     \
                                           const DecoderLayerDims&, const LayerPass&, const ActivationStore&, int, \
                                           Arena&);                                                              \
  template void decoder_layer_decode<T>(T*, int64_t, int64_t, int64_t, T*, const DecoderLayerWeights<T>&,        \
                                        const DecoderLayerDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
