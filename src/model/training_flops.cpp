// Model FLOPs of a training token from a config and its parameter table (model.h,
// training_flops_of): the MFU's count and `trillion plan`'s, without building a Model.
#include <variant>

#include "model/decoder_layer.h"
#include "model/model.h"

namespace trillion {

TrainingFlops training_flops_of(const ModelConfig& config, const ParamTable& table, int64_t seq) {
  TrainingFlops flops;
  flops.per_token = 6.0 * double(config.vocab_size) * double(config.hidden_size);
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    const DecoderLayerDims dims = DecoderLayerDims::from_config(config, layer);
    flops.per_token += dims.flops_per_token(seq);
    if (const MoeDims* moe = std::get_if<MoeDims>(&dims.ffn))
      flops.routed_experts += 18.0 * double(moe->top_k()) * double(moe->hidden) * double(moe->width);
  }
  if (config.lora == nullptr) return flops;
  const double routed_share =
      config.num_experts > 0 ? double(config.num_experts_per_tok) / double(config.num_experts) : 0.0;
  for (const ParamSpec& spec : table.entries()) {
    double change = 0.0;
    // The routed experts' tensors: their group's, and their adapters' pairs [E, …] (k of E per token).
    const bool routed = spec.adapter ? spec.shape.size() == 3 : spec.group == ParamGroup::expert;
    if (spec.adapter) {
      change = (spec.name.ends_with(".lora_A.weight") ? 8.0 : 6.0) * double(spec.numel()) * (routed ? routed_share : 1.0);
      if (routed) flops.routed_experts += change;
    } else if (spec.frozen && spec.use != ParamUse::values) {
      change = -2.0 * double(spec.numel()) * (routed ? routed_share : 1.0);
      if (routed) flops.routed_experts += change;
    }
    flops.per_token += change;
  }
  return flops;
}

}  // namespace trillion
