// Family conventions by model_type (see family.h). Sources: transformers 5.x modelling and
// configuration files of each family (docs/architecture.md, "Family conventions" and "Float32 traps of
// transformers").
#include "model/family.h"

#include <algorithm>

#include "core/error.h"

namespace trillion {
namespace {

// Every family the engine builds: its model_type and what it sets beyond Family's defaults.
struct FamilyEntry {
  const char* model_type;
  void (*conventions)(Family& f);
};

void deepseek_v3(Family& f) {  // DeepseekV3Config
  f.mla = true;
  f.yarn_softmax_mscale = true;
  f.default_q_lora_rank = 1536;
  f.router = RouterScoring::sigmoid;
  f.default_norm_topk_prob = true;
  f.default_first_k_dense_replace = 3;
  f.experts_field = "n_routed_experts";
  f.default_experts = 256, f.default_top_k = 8, f.default_expert_width = 2048;
  f.default_shared_experts = 1;
  f.default_routed_scaling_factor = 2.5;
}

constexpr FamilyEntry kFamilies[] = {
    {"qwen3", [](Family& f) { f.always_qk_norm = true; }},
    {"qwen3_moe",
     [](Family& f) {  // Qwen3MoeConfig
       f.always_qk_norm = true;
       f.qwen_moe_placement = true;
       f.experts_field = "num_local_experts";
       f.default_experts = 128, f.default_top_k = 8, f.default_expert_width = 768;
       f.default_aux_loss_coef = 0.001;
     }},
    {"qwen3_next",
     [](Family& f) {  // Qwen3NextConfig
       f.linear_attention = LinearAttention::gated_deltanet;
       f.zero_centred_norms = true;
       f.gated_attention = true;
       f.always_qk_norm = true;
       f.qwen_moe_placement = true;
       f.shared_expert_gated = true;
       f.default_norm_topk_prob = true;
       f.default_partial_rotary_factor = 0.25;
       f.default_experts = 512, f.default_top_k = 10, f.default_expert_width = 512;
       f.default_shared_expert_width = 512;
       f.default_aux_loss_coef = 0.001;
     }},
    {"glm4_moe",
     [](Family& f) {  // Glm4MoeConfig
       f.router = RouterScoring::sigmoid;
       f.default_norm_topk_prob = true;
       f.default_partial_rotary_factor = 0.5;
       f.default_first_k_dense_replace = 1;
       f.experts_field = "n_routed_experts";
       f.default_experts = 128, f.default_top_k = 8, f.default_expert_width = 1408;
       f.default_shared_experts = 1;
     }},
    {"deepseek_v3", deepseek_v3},
    {"deepseek_v32",
     [](Family& f) {  // DeepseekV32Config: DeepSeek-V3's, with every layer indexed and always interleaved
       deepseek_v3(f);
       f.mla_always_interleaved = true;
       f.sparse_attention_name = "indexed_attention";
       f.sparse_layers_by_default = true;
     }},
    {"kimi_linear",
     [](Family& f) {  // KimiLinearConfig
       f.linear_attention = LinearAttention::kimi_delta;
       f.mla = true;
       f.mla_rope = false;
       f.router = RouterScoring::sigmoid;
       f.default_norm_topk_prob = true;
       f.default_first_k_dense_replace = 1;
       f.default_routed_scaling_factor = 2.446;
       f.checkpoint_renames = {{".mlp.", ".block_sparse_moe."}, {".self_attn.forget_gate.", ".self_attn."}};
       f.expert_parts = {"w1", "w3", "w2"};
     }},
};

}  // namespace

Family family_of(const std::string& model_type) {
  for (const FamilyEntry& entry : kFamilies) {
    if (model_type != entry.model_type) continue;
    Family family;
    entry.conventions(family);
    return family;
  }
  TRILLION_CHECK(false, "unknown model_type ", model_type);
  return {};
}

std::vector<std::string> model_types() {
  std::vector<std::string> types;
  for (const FamilyEntry& entry : kFamilies) types.push_back(entry.model_type);
  return types;
}

bool is_known_model_type(const std::string& model_type) {
  const std::vector<std::string> types = model_types();
  return std::find(types.begin(), types.end(), model_type) != types.end();
}

std::string known_model_types() {
  std::string text;
  for (const std::string& type : model_types()) text += (text.empty() ? "" : ", ") + type;
  return text;
}

}  // namespace trillion
