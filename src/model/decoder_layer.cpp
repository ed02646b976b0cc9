// Decoder layer: parameter declaration and binding, and the two sublayers chained. See decoder_layer.h.
#include "model/decoder_layer.h"

#include <cmath>

namespace trillion {

DecoderLayerDims DecoderLayerDims::from_config(const ModelConfig& config) {
  DecoderLayerDims dims;
  dims.attn = AttentionBlockDims::from_config(config);
  dims.mlp.hidden = config.hidden_size;
  dims.mlp.intermediate = config.intermediate_size;
  dims.mlp.eps = config.rms_norm_eps;
  dims.mlp.zero_centred = config.zero_centred_norms();
  return dims;
}

std::string decoder_layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

void add_decoder_layer_params(ParamTable& table, const ModelConfig& config, int layer) {
  const AttentionBlockDims a = AttentionBlockDims::from_config(config);
  const int64_t D = config.hidden_size, I = config.intermediate_size;
  const double std_in = config.initializer_range;
  const double std_out = config.initializer_range / std::sqrt(2.0 * double(config.num_hidden_layers));
  const InitKind norm_init = config.zero_centred_norms() ? InitKind::zeros : InitKind::ones;
  const std::string prefix = decoder_layer_prefix(layer);
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, InitKind init, double std, bool decay) {
    ParamSpec spec;
    spec.name = prefix + name;
    spec.shape = std::move(shape);
    spec.unit = 1 + layer;
    spec.init = init;
    spec.init_std = init == InitKind::normal ? std : 0.0;
    spec.weight_decay = decay;
    table.add(std::move(spec));
  };
  add("input_layernorm.weight", {D}, norm_init, 0, false);
  add("self_attn.q_proj.weight", {a.q_proj_out(), D}, InitKind::normal, std_in, true);
  add("self_attn.k_proj.weight", {a.kv_width(), D}, InitKind::normal, std_in, true);
  add("self_attn.v_proj.weight", {a.kv_width(), D}, InitKind::normal, std_in, true);
  add("self_attn.o_proj.weight", {D, a.q_width()}, InitKind::normal, std_out, true);
  add("self_attn.q_norm.weight", {a.head_dim}, norm_init, 0, false);
  add("self_attn.k_norm.weight", {a.head_dim}, norm_init, 0, false);
  add("post_attention_layernorm.weight", {D}, norm_init, 0, false);
  add("mlp.gate_proj.weight", {I, D}, InitKind::normal, std_in, true);
  add("mlp.up_proj.weight", {I, D}, InitKind::normal, std_in, true);
  add("mlp.down_proj.weight", {D, I}, InitKind::normal, std_out, true);
}

template <class T>
DecoderLayerWeights<T> bind_decoder_layer(const ParamTable& table, T* base, int layer) {
  const std::string prefix = decoder_layer_prefix(layer);
  const auto at = [&](const char* name) { return base + table.find(prefix + name).offset; };
  DecoderLayerWeights<T> w;
  w.attn.input_norm = at("input_layernorm.weight");
  w.attn.q_proj = at("self_attn.q_proj.weight");
  w.attn.k_proj = at("self_attn.k_proj.weight");
  w.attn.v_proj = at("self_attn.v_proj.weight");
  w.attn.o_proj = at("self_attn.o_proj.weight");
  w.attn.q_norm = at("self_attn.q_norm.weight");
  w.attn.k_norm = at("self_attn.k_norm.weight");
  w.mlp.norm = at("post_attention_layernorm.weight");
  w.mlp.gate_proj = at("mlp.gate_proj.weight");
  w.mlp.up_proj = at("mlp.up_proj.weight");
  w.mlp.down_proj = at("mlp.down_proj.weight");
  return w;
}

template <class T>
void decoder_layer_forward(T* x, const int32_t* positions, int64_t batch, int64_t seq, const DecoderLayerWeights<T>& w,
                           const DecoderLayerDims& dims, ActivationStore* store, int layer, Arena& scratch) {
  scratch.reset();
  attention_block_forward(x, positions, batch, seq, w.attn, dims.attn, store, layer, scratch);
  scratch.reset();
  mlp_forward(x, batch * seq, w.mlp, dims.mlp, store, layer, scratch);
}

template <class T>
void decoder_layer_backward(T* dx, const int32_t* positions, int64_t batch, int64_t seq,
                            const DecoderLayerWeights<T>& w, const DecoderLayerWeights<T>& grads,
                            const DecoderLayerDims& dims, const ActivationStore& store, int layer, Arena& scratch) {
  scratch.reset();
  mlp_backward(dx, batch * seq, w.mlp, grads.mlp, dims.mlp, store, layer, scratch);
  scratch.reset();
  attention_block_backward(dx, positions, batch, seq, w.attn, grads.attn, dims.attn, store, layer, scratch);
}

template <class T>
void decoder_layer_decode(T* x, int64_t n, int64_t past, T* k_cache, T* v_cache, const DecoderLayerWeights<T>& w,
                          const DecoderLayerDims& dims, Arena& scratch) {
  scratch.reset();
  attention_block_decode(x, n, past, k_cache, v_cache, w.attn, dims.attn, scratch);
  scratch.reset();
  mlp_forward(x, n, w.mlp, dims.mlp, /*store=*/nullptr, 0, scratch);
}

#define TRILLION_INSTANTIATE(T)                                                                                  \
  template DecoderLayerWeights<T> bind_decoder_layer<T>(const ParamTable&, T*, int);                             \
  template void decoder_layer_forward<T>(T*, const int32_t*, int64_t, int64_t, const DecoderLayerWeights<T>&,    \
                                         const DecoderLayerDims&, ActivationStore*, int, Arena&);                \
  template void decoder_layer_backward<T>(T*, const int32_t*, int64_t, int64_t, const DecoderLayerWeights<T>&,   \
                                          const DecoderLayerWeights<T>&, const DecoderLayerDims&,                \
                                          const ActivationStore&, int, Arena&);                                  \
  template void decoder_layer_decode<T>(T*, int64_t, int64_t, T*, T*, const DecoderLayerWeights<T>&,             \
                                        const DecoderLayerDims&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
