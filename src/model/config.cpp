// ModelConfig parsing and validation (see config.h). Field names are the Hugging Face ones, with
// each family's attribute-map aliases; a JSON null counts as absent. Every error reads
// `SOURCE: field "NAME": PROBLEM; expected WHAT`.
#include "model/config.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/config_fields.h"
#include "model/family.h"

namespace trillion {
namespace {

using config_detail::FieldReader;
using config_detail::parse_kimi_linear_attention;
using config_detail::parse_mla;
using config_detail::parse_rope;
using config_detail::rope_json;

constexpr LayerType kLayerTypes[] = {LayerType::full_attention, LayerType::linear_attention,
                                     LayerType::sparse_attention};

std::string allowed_layer_types() {
  std::string text;
  for (LayerType type : kLayerTypes) text += (text.empty() ? "" : ", ") + std::string(layer_type_name(type));
  return text;
}


std::vector<LayerType> parse_layer_types(const FieldReader& fields, const Family& family, int64_t num_layers) {
  std::vector<LayerType> layer_types;
  if (fields.has("layer_types")) {
    const nlohmann::json& list = fields.at("layer_types");
    if (!list.is_array()) fields.fail_field("layer_types", str_cat("got ", list.dump(), "; expected an array of strings"));
    if (static_cast<int64_t>(list.size()) != num_layers)
      fields.fail_field("layer_types", str_cat("has ", list.size(), " entries; expected ", num_layers,
                                               " (num_hidden_layers)"));
    for (size_t i = 0; i < list.size(); ++i) {
      const LayerType* match = nullptr;
      for (const LayerType& type : kLayerTypes)
        if (list[i].is_string() && (list[i].get<std::string>() == layer_type_name(type) ||
                                    (type == LayerType::sparse_attention &&
                                     list[i].get<std::string>() == family.sparse_attention_name)))
          match = &type;
      if (match == nullptr)
        fields.fail_element("layer_types", i, str_cat("unknown layer type ", list[i].dump(), "; expected one of ",
                                                      allowed_layer_types()));
      layer_types.push_back(*match);
    }
  } else if (fields.has("full_attention_interval")) {
    // Qwen3-Next convention: every interval-th layer (1-based) is full attention.
    const int64_t interval = fields.positive("full_attention_interval", 1);
    for (int64_t i = 0; i < num_layers; ++i)
      layer_types.push_back((i + 1) % interval == 0 ? LayerType::full_attention : LayerType::linear_attention);
  } else {
    layer_types.assign(static_cast<size_t>(num_layers),
                       family.sparse_layers_by_default ? LayerType::sparse_attention : LayerType::full_attention);
  }
  return layer_types;
}

bool uses(const std::vector<LayerType>& layer_types, LayerType type) {
  for (LayerType t : layer_types)
    if (t == type) return true;
  return false;
}

// Which layers get an MoE FFN, by the family's rule (or Kimi's explicit `mlp_layer_types`).
std::vector<FfnType> parse_ffn_placement(const FieldReader& fields, const Family& family, const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  std::vector<FfnType> types(L, FfnType::dense);
  if (fields.has("mlp_layer_types")) {
    const nlohmann::json& list = fields.at("mlp_layer_types");
    if (!list.is_array() || static_cast<int64_t>(list.size()) != L)
      fields.fail_field("mlp_layer_types", str_cat("got ", list.dump(), "; expected an array of ", L,
                                                   " strings (num_hidden_layers)"));
    for (int64_t i = 0; i < L; ++i) {
      const std::string name = list[i].is_string() ? list[i].get<std::string>() : "";
      if (name != "dense" && name != "sparse")
        fields.fail_element("mlp_layer_types", i, str_cat("got ", list[i].dump(), "; expected \"dense\" or \"sparse\""));
      types[i] = name == "sparse" ? FfnType::sparse : FfnType::dense;
    }
  } else if (family.qwen_moe_placement) {
    const int64_t step = fields.positive("decoder_sparse_step", 1);
    const std::vector<int64_t> dense_only = fields.integer_list("mlp_only_layers");
    for (size_t i = 0; i < dense_only.size(); ++i)
      if (dense_only[i] < 0 || dense_only[i] >= L)
        fields.fail_element("mlp_only_layers", i, str_cat("got ", dense_only[i], "; expected a layer in [0, ", L, ")"));
    for (int64_t i = 0; i < L; ++i) {
      bool dense = (i + 1) % step != 0;
      for (int64_t d : dense_only) dense = dense || d == i;
      types[i] = c.num_experts > 0 && !dense ? FfnType::sparse : FfnType::dense;
    }
  } else {
    const int64_t first_dense = fields.non_negative("first_k_dense_replace", family.default_first_k_dense_replace);
    for (int64_t i = 0; i < L; ++i) types[i] = c.num_experts > 0 && i >= first_dense ? FfnType::sparse : FfnType::dense;
  }
  for (int64_t i = 0; i < L; ++i)
    if (types[i] == FfnType::sparse && c.num_experts == 0)
      fields.fail_element("mlp_layer_types", i, "is \"sparse\" but the config has no experts; expected num_experts > 0");
  return types;
}

void parse_moe(const FieldReader& fields, const Family& family, ModelConfig& c) {
  c.num_experts = fields.non_negative(fields.alias({"num_experts", "num_local_experts", "n_routed_experts"}),
                                      family.default_experts);
  c.mlp_layer_types = parse_ffn_placement(fields, family, c);
  if (c.num_experts == 0) return;
  const char* k_name = fields.alias({"num_experts_per_tok", "num_experts_per_token"});
  c.num_experts_per_tok = fields.non_negative(k_name, family.default_top_k);
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
    fields.fail_field(k_name, str_cat("got ", c.num_experts_per_tok, "; expected 1 to num_experts = ", c.num_experts));
  c.moe_intermediate_size = fields.non_negative("moe_intermediate_size", family.default_expert_width);
  if (c.moe_intermediate_size <= 0)
    fields.fail_field("moe_intermediate_size", "expected a positive integer (num_experts > 0)");
  c.norm_topk_prob = fields.boolean(fields.alias({"norm_topk_prob", "moe_renormalize"}), family.default_norm_topk_prob);
  if (family.shared_expert_gated) {
    c.shared_expert_intermediate_size =
        fields.non_negative("shared_expert_intermediate_size", family.default_shared_expert_width);
  }
  if (family.router == RouterScoring::sigmoid) {
    c.n_shared_experts =
        fields.non_negative(fields.alias({"n_shared_experts", "num_shared_experts"}), family.default_shared_experts);
    c.routed_scaling_factor = fields.positive_number("routed_scaling_factor", family.default_routed_scaling_factor);
    const char* group_name = fields.alias({"n_group", "num_expert_group"});
    c.n_group = fields.positive(group_name, 1);
    c.topk_group = fields.positive("topk_group", 1);
    const int64_t group_size = c.num_experts / c.n_group;
    if (c.num_experts % c.n_group != 0 || (c.n_group > 1 && group_size < 2))
      fields.fail_field(group_name, str_cat("got ", c.n_group, "; expected a divisor of num_experts = ", c.num_experts,
                                            " leaving at least 2 experts per group"));
    if (c.topk_group > c.n_group || c.topk_group * group_size < c.num_experts_per_tok)
      fields.fail_field("topk_group", str_cat("got ", c.topk_group, "; expected at most ", c.n_group,
                                              " groups holding at least num_experts_per_tok = ",
                                              c.num_experts_per_tok, " experts"));
  }
  c.output_router_logits = fields.boolean("output_router_logits", c.output_router_logits);
  c.router_aux_loss_coef = fields.number("router_aux_loss_coef", family.default_aux_loss_coef);
  if (c.router_aux_loss_coef < 0.0)
    fields.fail_field("router_aux_loss_coef", str_cat("got ", c.router_aux_loss_coef, "; expected a value >= 0"));
  const std::string aux_type = fields.string("router_aux_loss_type", aux_loss_type_name(c.router_aux_loss_type));
  bool known = false;
  for (AuxLossType type : {AuxLossType::pooled, AuxLossType::per_layer, AuxLossType::sequence}) {
    if (aux_type == aux_loss_type_name(type)) c.router_aux_loss_type = type, known = true;
  }
  if (!known)
    fields.fail_field("router_aux_loss_type", str_cat("got \"", aux_type, "\"; expected pooled, per_layer or sequence"));
  // The Switch-style losses take P_e as a probability: sigmoid scores are not one (they would need
  // Megatron's per-token normalization); the sequence-wise loss normalizes them itself.
  if (family.router == RouterScoring::sigmoid && c.aux_loss_coef() != 0.0 && c.router_aux_loss_type != AuxLossType::sequence)
    fields.fail_field("router_aux_loss_type", str_cat("\"", aux_type, "\" with a sigmoid router (", c.model_type,
                                                      "): not built; expected \"sequence\" (or router_aux_loss_coef 0)"));
  c.router_z_loss_coef = fields.number("router_z_loss_coef", c.router_z_loss_coef);
  if (c.router_z_loss_coef < 0.0)
    fields.fail_field("router_z_loss_coef", str_cat("got ", c.router_z_loss_coef, "; expected a value >= 0"));
  c.moe_capacity_factor = fields.number("moe_capacity_factor", c.moe_capacity_factor);
  if (c.moe_capacity_factor < 0.0 || !std::isfinite(c.moe_capacity_factor))
    fields.fail_field("moe_capacity_factor", str_cat("got ", c.moe_capacity_factor, "; expected 0 (dropless) or a positive number"));
}

// Settings that would change the model and are not built: errors, never silently another model.
void reject_unbuilt(const FieldReader& fields) {
  const std::string act = fields.string("hidden_act", "silu");
  if (act != "silu") fields.fail_field("hidden_act", str_cat("\"", act, "\": not built yet; expected \"silu\""));
  if (fields.boolean("use_sliding_window", false))
    fields.fail_field("use_sliding_window", "true: not built yet; expected false");
  for (const char* off : {"sliding_window", "max_window_layers"}) fields.has(off);  // the window's settings: unused while off
  if (fields.boolean("mlp_bias", false)) fields.fail_field("mlp_bias", "true: not built yet; expected false");
  const double dropout = fields.number("attention_dropout", 0.0);
  if (dropout != 0.0) fields.fail_field("attention_dropout", str_cat("got ", dropout, ": not built yet; expected 0"));
}

}  // namespace

const char* layer_type_name(LayerType type) {
  switch (type) {
    case LayerType::full_attention: return "full_attention";
    case LayerType::linear_attention: return "linear_attention";
    case LayerType::sparse_attention: return "sparse_attention";
  }
  return "?";
}

const char* ffn_type_name(FfnType type) { return type == FfnType::sparse ? "sparse" : "dense"; }

const char* aux_loss_type_name(AuxLossType type) {
  switch (type) {
    case AuxLossType::pooled: return "pooled";
    case AuxLossType::per_layer: return "per_layer";
    case AuxLossType::sequence: return "sequence";
  }
  return "?";
}


ModelConfig ModelConfig::from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) fail(source, ": config is ", json.type_name(), "; expected a JSON object");
  const FieldReader fields(json, source);
  ModelConfig c;
  c.source = source;

  c.model_type = fields.string("model_type", c.model_type);
  if (!is_known_model_type(c.model_type))
    fields.fail_field("model_type", str_cat("unknown model type \"", c.model_type, "\"; expected one of ",
                                            known_model_types()));
  const Family family = family_of(c.model_type);

  c.vocab_size = fields.required_positive("vocab_size");
  c.hidden_size = fields.required_positive("hidden_size");
  c.num_hidden_layers = fields.required_positive("num_hidden_layers");
  // Far above any published model (they have at most a few hundred), so that an absurd count is
  // refused here instead of building millions of layers.
  constexpr int64_t kMaxLayers = 16384;
  if (c.num_hidden_layers > kMaxLayers)
    fields.fail_field("num_hidden_layers", str_cat("got ", c.num_hidden_layers, "; expected at most ", kMaxLayers));
  c.num_attention_heads = fields.required_positive("num_attention_heads");
  c.num_key_value_heads = fields.positive("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fields.fail_field("num_key_value_heads", str_cat("got ", c.num_key_value_heads, "; expected a divisor of ",
                                                     "num_attention_heads = ", c.num_attention_heads));
  // transformers' default when absent: hidden_size // num_attention_heads (rounded down).
  c.head_dim = fields.positive("head_dim", c.hidden_size / c.num_attention_heads);
  if (c.head_dim <= 0)
    fields.fail_field("head_dim", str_cat("missing and hidden_size ", c.hidden_size, " < num_attention_heads ",
                                          c.num_attention_heads, "; expected head_dim to be given"));
  c.max_position_embeddings =
      fields.positive(fields.alias({"max_position_embeddings", "model_max_length"}), c.max_position_embeddings);
  c.rms_norm_eps = fields.positive_number("rms_norm_eps", c.rms_norm_eps);
  parse_rope(fields, family, c);
  if (family.mla) parse_mla(fields, family, c);
  c.initializer_range = fields.positive_number("initializer_range", c.initializer_range);
  c.tie_word_embeddings = fields.boolean("tie_word_embeddings", c.tie_word_embeddings);
  c.attention_bias = fields.boolean("attention_bias", c.attention_bias);
  c.use_qk_norm = family.always_qk_norm || fields.boolean("use_qk_norm", false);
  reject_unbuilt(fields);
  c.layer_types = parse_layer_types(fields, family, c.num_hidden_layers);
  if (family.mla && c.q_lora_rank == 0 && uses(c.layer_types, LayerType::sparse_attention))
    fields.fail_field("q_lora_rank", "null; expected a positive integer (the indexer of sparse_attention layers reads "
                                     "the query latent)");

  c.linear_num_key_heads = fields.non_negative("linear_num_key_heads", 0);
  c.linear_num_value_heads = fields.non_negative("linear_num_value_heads", 0);
  c.linear_key_head_dim = fields.non_negative("linear_key_head_dim", 0);
  c.linear_value_head_dim = fields.non_negative("linear_value_head_dim", 0);
  c.linear_conv_kernel_dim = fields.positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  const std::vector<std::string> unread_nested =
      family.linear_attention == LinearAttention::kimi_delta ? parse_kimi_linear_attention(fields, c)
                                                             : std::vector<std::string>{};
  if (uses(c.layer_types, LayerType::linear_attention)) {
    for (const auto& [name, value] : {std::pair{"linear_num_key_heads", c.linear_num_key_heads},
                                      std::pair{"linear_num_value_heads", c.linear_num_value_heads},
                                      std::pair{"linear_key_head_dim", c.linear_key_head_dim},
                                      std::pair{"linear_value_head_dim", c.linear_value_head_dim}})
      if (value <= 0) fields.fail_field(name, "expected a positive integer (the config has linear_attention layers)");
  }

  parse_moe(fields, family, c);
  bool any_dense = false;
  for (FfnType type : c.mlp_layer_types) any_dense = any_dense || type == FfnType::dense;
  c.intermediate_size = any_dense ? fields.required_positive("intermediate_size")
                                  : fields.non_negative("intermediate_size", 0);

  c.index_n_heads = fields.non_negative("index_n_heads", 0);
  c.index_head_dim = fields.non_negative("index_head_dim", 0);
  c.index_topk = fields.positive("index_topk", c.index_topk);
  if (uses(c.layer_types, LayerType::sparse_attention)) {
    for (const char* name : {"index_n_heads", "index_head_dim"})
      if (fields.integer(name, 0) <= 0) fields.fail_field(name, "expected a positive integer (the config has sparse_attention layers)");
  }
  c.unread_fields = fields.unread();
  c.unread_fields.insert(c.unread_fields.end(), unread_nested.begin(), unread_nested.end());
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": not valid JSON: ", error.what());
  }
  ModelConfig config = from_json(json, path);
  if (!config.unread_fields.empty()) {
    std::string names;
    for (const std::string& name : config.unread_fields) names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "warning: %s: fields the engine does not read: %s\n", path.c_str(), names.c_str());
  }
  return config;
}

nlohmann::json ModelConfig::to_json() const {
  const Family family = family_of(model_type);
  nlohmann::json layer_names = nlohmann::json::array();
  for (LayerType type : layer_types)
    layer_names.push_back(type == LayerType::sparse_attention ? family.sparse_attention_name : layer_type_name(type));
  nlohmann::json json = {
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_parameters", rope_json(*this)},
      {"initializer_range", initializer_range},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_bias", attention_bias},
      {"hidden_act", hidden_act},
      {"layer_types", layer_names},
      {"linear_num_key_heads", linear_num_key_heads},
      {"linear_num_value_heads", linear_num_value_heads},
      {"linear_key_head_dim", linear_key_head_dim},
      {"linear_value_head_dim", linear_value_head_dim},
      {"linear_conv_kernel_dim", linear_conv_kernel_dim},
      {"index_n_heads", index_n_heads},
      {"index_head_dim", index_head_dim},
      {"index_topk", index_topk},
  };
  if (family.linear_attention == LinearAttention::kimi_delta) {  // its own form, as its config.json has it (parse_kimi_linear_attention)
    nlohmann::json kda = nlohmann::json::array(), full = nlohmann::json::array();
    for (int64_t l = 0; l < num_hidden_layers; ++l)
      (layer_types[l] == LayerType::linear_attention ? kda : full).push_back(l + 1);
    for (const char* generic : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                "linear_value_head_dim", "linear_conv_kernel_dim"})
      json.erase(generic);
    nlohmann::json block = {{"short_conv_kernel_size", linear_conv_kernel_dim}, {"kda_layers", kda},
                            {"full_attn_layers", full}};
    if (linear_num_key_heads > 0) block["num_heads"] = linear_num_key_heads;  // 0: never given (no KDA layer)
    if (linear_key_head_dim > 0) block["head_dim"] = linear_key_head_dim;
    json["linear_attn_config"] = block;
  }
  if (!family.always_qk_norm) json["use_qk_norm"] = use_qk_norm;
  if (family.mla) {
    json["q_lora_rank"] = q_lora_rank > 0 ? nlohmann::json(q_lora_rank) : nlohmann::json(nullptr);
    json.update({{"kv_lora_rank", kv_lora_rank}, {"qk_nope_head_dim", qk_nope_head_dim},
                 {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim}});
    if (!family.mla_always_interleaved) json["rope_interleave"] = rope_interleave;
  }
  json[family.experts_field] = num_experts;  // the name transformers' config.json uses for this family
  if (num_experts == 0) return json;
  // The placement in the family's own fields, so transformers builds the same layers.
  int64_t leading_dense = 0;
  while (leading_dense < num_hidden_layers && !is_moe_layer(leading_dense)) ++leading_dense;
  bool prefix_rule = true;
  for (int64_t l = leading_dense; l < num_hidden_layers; ++l) prefix_rule = prefix_rule && is_moe_layer(l);
  if (family.qwen_moe_placement) {
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t l = 0; l < num_hidden_layers; ++l)
      if (!is_moe_layer(l)) dense.push_back(l);
    json["decoder_sparse_step"] = 1;
    json["mlp_only_layers"] = dense;
  } else if (prefix_rule) {
    json["first_k_dense_replace"] = leading_dense;
  } else {
    nlohmann::json ffn_names = nlohmann::json::array();
    for (FfnType type : mlp_layer_types) ffn_names.push_back(ffn_type_name(type));
    json["mlp_layer_types"] = ffn_names;
  }
  json["num_experts_per_tok"] = num_experts_per_tok;
  json["moe_intermediate_size"] = moe_intermediate_size;
  json["norm_topk_prob"] = norm_topk_prob;
  json["output_router_logits"] = output_router_logits;
  json["router_aux_loss_coef"] = router_aux_loss_coef;
  json["router_aux_loss_type"] = aux_loss_type_name(router_aux_loss_type);
  json["router_z_loss_coef"] = router_z_loss_coef;
  json["moe_capacity_factor"] = moe_capacity_factor;
  if (family.shared_expert_gated) json["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
  if (family.router == RouterScoring::sigmoid) {
    json["n_shared_experts"] = n_shared_experts;
    json["routed_scaling_factor"] = routed_scaling_factor;
    json["n_group"] = n_group;
    json["topk_group"] = topk_group;
  }
  return json;
}

}  // namespace trillion
