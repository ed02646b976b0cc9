// ModelConfig: the Hugging Face style config.json of a model, parsed and validated.
//
// One schema covers the families the engine targets (Qwen3, Qwen3-Next, DeepSeek-V3.2, Kimi):
// `model_type` selects family conventions (qwen3_next: zero-centred norms, gated q_proj).
// Field names are the Hugging Face ones. Every error names the file, the field and what was
// expected (trillion::Error). Fields of layer kinds that are not built yet are parsed and kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trillion {

enum class LayerType { full_attention, linear_attention, sparse_attention };
const char* layer_type_name(LayerType type);

struct ModelConfig {
  std::string model_type = "qwen3";  // "qwen3" | "qwen3_next" | "qwen3_moe" | "deepseek_v32" | "kimi"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // default hidden_size / num_attention_heads
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // only false is built
  std::string hidden_act = "silu";  // MLP activation; only "silu" is built
  nlohmann::json rope_scaling;      // null = plain RoPE (only null is built); kept as given
  bool use_sliding_window = false;  // only false is built
  std::vector<LayerType> layer_types;  // size num_hidden_layers; from `layer_types` or `full_attention_interval`

  // Linear attention (Gated DeltaNet / KDA), kept for later issues.
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 4;
  // MoE, kept for later issues.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.0;
  // Sparse attention (DeepSeek-V3.2 indexer), kept for later issues.
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 2048;

  bool zero_centred_norms() const { return model_type == "qwen3_next"; }
  bool gated_attention() const { return model_type == "qwen3_next"; }
  int64_t rotary_dim() const;  // partial_rotary_factor · head_dim, even

  std::string source;  // the file it was read from, named in "not built yet" errors (not in to_json)

  // Parses and validates; `source` (the file path) is named in every error.
  static ModelConfig from_json(const nlohmann::json& json, const std::string& source);
  static ModelConfig load(const std::string& path);
  nlohmann::json to_json() const;
};

}  // namespace trillion
