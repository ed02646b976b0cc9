// Family conventions chosen by `model_type`, in one place: what transformers' modelling code of
// each family does that its config.json does not say (docs/architecture.md, "Family conventions").
//
//   family        norms           attention              router    FFN placement rule
//   qwen3         x̂·w             q_norm/k_norm          –         dense
//   qwen3_moe     x̂·w             q_norm/k_norm          softmax   mlp_only_layers + decoder_sparse_step
//   qwen3_next    x̂·(1+w)         gated q_proj, q/k_norm softmax   mlp_only_layers + decoder_sparse_step
//   glm4_moe      x̂·w             use_qk_norm, bias      sigmoid   first_k_dense_replace
//   deepseek_v3   x̂·w             MLA (RoPE, YaRN)       sigmoid   first_k_dense_replace
//   deepseek_v32  x̂·w             MLA + indexer          sigmoid   first_k_dense_replace
//   kimi_linear   x̂·w             KDA / MLA without RoPE sigmoid   mlp_layer_types
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ops/moe_router.h"

namespace trillion {

// The mixer of a family's linear_attention layers.
enum class LinearAttention {
  none,            // the family has no linear attention
  gated_deltanet,  // qwen3_next: Gated DeltaNet
  kimi_delta,      // kimi_linear: Kimi Delta Attention, its sizes in config.json's linear_attn_config block
};

struct Family {
  LinearAttention linear_attention = LinearAttention::none;
  bool zero_centred_norms = false;  // every RMSNorm except linear attention's gated one
  bool gated_attention = false;     // q_proj carries a sigmoid output gate per head
  bool always_qk_norm = false;      // q_norm / k_norm regardless of use_qk_norm
  bool mla = false;                 // attention layers are multi-head latent attention
  bool mla_rope = true;             // MLA rotates its rope part (kimi_linear: no position embedding)
  bool mla_always_interleaved = false;  // deepseek_v32 ignores rope_interleave (always interleaved)
  bool yarn_softmax_mscale = false;     // DeepSeek: softmax scale · mscale(factor, mscale_all_dim)²
  int64_t default_q_lora_rank = 0;      // transformers' Config default (0: None, one q_proj)
  const char* sparse_attention_name = "sparse_attention";  // in layer_types (deepseek_v32: indexed_attention)
  bool sparse_layers_by_default = false;  // deepseek_v32: every layer sparse when layer_types is absent
  RouterScoring router = RouterScoring::softmax;
  bool qwen_moe_placement = false;  // else first_k_dense_replace / mlp_layer_types
  bool shared_expert_gated = false;  // qwen3_next: sigmoid(shared_expert_gate(x)) · shared_expert(x)
  bool default_norm_topk_prob = false;
  double default_partial_rotary_factor = 1.0;
  int64_t default_first_k_dense_replace = 0;
  // transformers' Config defaults of the MoE fields, used when a config file leaves them out (a
  // silently different model is the worst outcome), and the name its config.json stores E under.
  const char* experts_field = "num_experts";
  int64_t default_experts = 0, default_top_k = 0, default_expert_width = 0;
  int64_t default_shared_expert_width = 0;  // qwen3_next's gated shared expert
  int64_t default_shared_experts = 0;       // glm4_moe / deepseek: n_shared_experts
  double default_aux_loss_coef = 0.0;
  double default_routed_scaling_factor = 1.0;
  // How save_pretrained's default layout names this family's tensors, from the in-memory names:
  // substring replacements applied in order (Kimi: ".mlp." → ".block_sparse_moe.", the forget
  // gate's tensors directly under self_attn), and the routed experts' part names.
  std::vector<std::pair<std::string, std::string>> checkpoint_renames;
  std::vector<std::string> expert_parts = {"gate_proj", "up_proj", "down_proj"};
};

// The conventions of a known model_type (CHECK-fails on an unknown one: config parsing rejects those).
Family family_of(const std::string& model_type);

// The model types a config may name: a list, and comma-separated (for error messages).
std::vector<std::string> model_types();
std::string known_model_types();
bool is_known_model_type(const std::string& model_type);

}  // namespace trillion
