// ModelConfig: the Hugging Face style config.json of a model, parsed and validated.
//
// One schema covers the families the engine targets (Qwen3, Qwen3-MoE, Qwen3-Next, GLM-4-MoE,
// DeepSeek-V3/V3.2, Kimi-Linear). Config files are read as transformers 5.x writes them
// (`rope_parameters` dict) and as older versions did (top-level `rope_theta`,
// `partial_rotary_factor`, `rope_scaling`), with the families' attribute-map names
// (`num_local_experts`, Kimi's `num_experts_per_token`, `moe_renormalize`, `num_expert_group`, …).
// `model_type` selects the family conventions (model/family.h). The reader and the writer both come
// from one declaration of the fields (config.cpp's describe_config), so what to_json writes,
// from_json reads back as the same config. A field that would change the model
// and is not built is an error; fields the engine does not read are listed in `unread_fields`
// (ModelConfig::load prints them as one warning). Every error names the file, the field and what was
// expected (trillion::Error).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/lora_config.h"
#include "ops/rope.h"

namespace trillion {

enum class LayerType { full_attention, linear_attention, sparse_attention };
const char* layer_type_name(LayerType type);

// The FFN of a layer, as Kimi's `mlp_layer_types` names them.
enum class FfnType { dense, sparse };
const char* ffn_type_name(FfnType type);

// How the router's load-balancing loss is formed (docs/architecture.md, "MoE routing and balancing").
enum class AuxLossType {
  pooled,     // transformers' Qwen: E · Σ_e f_e P_e over all MoE layers' tokens together, f_e = count_e / T
  per_layer,  // Megatron: Σ_layers E · Σ_e f_e P_e with f_e = count_e / (T · k)
  sequence,   // DeepSeek-V3 sequence-wise: per sequence Σ_e f_e P_e, f_e = E / (k · S) · count_e, averaged
};
const char* aux_loss_type_name(AuxLossType type);

// RoPE scaling from `rope_parameters` / `rope_scaling` (transformers' names). "default" is plain
// RoPE; "yarn" is YaRN as DeepSeek's configs use it (modeling_rope_utils._compute_yarn_parameters).
struct RopeScaling {
  std::string type = "default";  // "default" or "yarn"
  double factor = 0.0;           // yarn: absent → max_position_embeddings / original_max_position_embeddings
  double original_max_position_embeddings = 0.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: absent
  double attention_factor = 0.0;              // 0: derived from factor, mscale, mscale_all_dim
  bool truncate = true;
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string model_type = "qwen3";
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
  double partial_rotary_factor = 1.0;  // family default (qwen3_next 0.25, glm4_moe 0.5) when absent
  RopeScaling rope_scaling;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections with a bias (o_proj never has one)
  bool use_qk_norm = true;      // per-head q_norm / k_norm (qwen: always; glm4_moe: `use_qk_norm`)
  std::string hidden_act = "silu";  // MLP activation; only "silu" is built
  std::vector<LayerType> layer_types;  // size num_hidden_layers; from `layer_types` or `full_attention_interval`

  // Linear attention: Gated DeltaNet (qwen3_next) and Kimi Delta Attention (kimi_linear).
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 4;

  // Mixture of experts.
  int64_t num_experts = 0;  // routed experts E (`num_experts`, `num_local_experts`, `n_routed_experts`)
  int64_t num_experts_per_tok = 0;            // k
  int64_t moe_intermediate_size = 0;          // expert width I
  int64_t shared_expert_intermediate_size = 0;  // qwen3_next: one gated shared expert of this width
  int64_t n_shared_experts = 0;               // glm4_moe / deepseek: one ungated shared MLP of n · I
  bool norm_topk_prob = false;                // family default when absent
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1, topk_group = 1;        // sigmoid routers: group-limited selection
  std::vector<FfnType> mlp_layer_types;       // size num_hidden_layers, by the family's placement rule
  double router_aux_loss_coef = 0.0;          // applied only when output_router_logits (as transformers)
  bool output_router_logits = false;
  AuxLossType router_aux_loss_type = AuxLossType::pooled;  // engine field
  double router_z_loss_coef = 0.0;                         // engine field
  double moe_capacity_factor = 0.0;  // engine field: 0 = dropless; else capacity ⌈factor · T · k / E⌉

  // Multi-head latent attention: the attention layers of deepseek_v3 / deepseek_v32 / kimi_linear.
  int64_t q_lora_rank = 0;  // 0: one q_proj (transformers' null); else q_a_proj → q_a_layernorm → q_b_proj
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // deepseek_v3's rope_interleave (deepseek_v32: always interleaved)

  // Sparse attention (DeepSeek-V3.2 indexer).
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 2048;

  int64_t rotary_dim() const;  // partial_rotary_factor · head_dim, even
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // MLA
  // The RoPE of `rotary_dim` dims (this config's theta, scaling and, when `interleaved`, pair layout).
  RopeSpec rope_spec(int64_t rotary_dim, bool interleaved) const;
  // DeepSeek's softmax-scale factor: mscale(factor, mscale_all_dim)² under YaRN with mscale_all_dim, else 1.
  double yarn_softmax_factor() const;
  bool is_moe_layer(int64_t layer) const { return mlp_layer_types[layer] == FfnType::sparse; }
  int64_t sparse_layers() const;  // layers of type sparse_attention (those with a lightning indexer)
  // The aux-loss coefficient in effect (0 unless output_router_logits, as transformers).
  double aux_loss_coef() const { return output_router_logits ? router_aux_loss_coef : 0.0; }

  std::string source;                      // the file it was read from (not in to_json)
  std::vector<std::string> unread_fields;  // fields present but not read (not in to_json)
  // The LoRA adapters a run attaches and trains on the frozen base (null: none, every tensor
  // trains). Not a config.json field: a run's --lora-* options or adapter_config.json (not in
  // to_json); model/param_rows.h.
  std::shared_ptr<const LoraConfig> lora;

  // Parses and validates; `source` (the file path) is named in every error.
  static ModelConfig from_json(const nlohmann::json& json, const std::string& source);
  // from_json of the file; prints one warning line listing unread fields, if any.
  static ModelConfig load(const std::string& path);
  nlohmann::json to_json() const;
  bool operator==(const ModelConfig&) const = default;
};

}  // namespace trillion
