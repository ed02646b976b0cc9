// ModelConfig's reader and writer, from one declaration of config.json's fields (describe_config).
// Field names are the Hugging Face ones, with each family's attribute-map aliases; a JSON null counts
// as absent. Every error reads `SOURCE: field "NAME": PROBLEM; expected WHAT`.
#include "model/config.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/config_fields.h"
#include "model/family.h"

namespace trillion {
namespace {

using config_detail::ConfigReader;
using config_detail::ConfigWriter;
using config_detail::FieldReader;
using config_detail::IntegerRule;
using config_detail::KimiLinearAttention;
using config_detail::NumberRule;
using config_detail::RopeParameters;

constexpr LayerType kLayerTypes[] = {LayerType::full_attention, LayerType::linear_attention,
                                     LayerType::sparse_attention};

std::string allowed_layer_types() {
  std::string text;
  for (LayerType type : kLayerTypes) text += (text.empty() ? "" : ", ") + std::string(layer_type_name(type));
  return text;
}

bool uses(const std::vector<LayerType>& layer_types, LayerType type) {
  for (LayerType t : layer_types)
    if (t == type) return true;
  return false;
}

// Each layer's mixer: `layer_types` (the family's name for sparse layers included), else Qwen3-Next's
// `full_attention_interval`, else every layer full attention (deepseek_v32: sparse). Written as
// layer_types.
struct LayerTypes {
  static void read(const FieldReader& fields, const Family& family, ModelConfig& c) {
    const int64_t num_layers = c.num_hidden_layers;
    std::vector<LayerType>& layer_types = c.layer_types;
    layer_types.clear();
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
  }
  static void write(nlohmann::json& json, const Family& family, const ModelConfig& c) {
    nlohmann::json names = nlohmann::json::array();
    for (LayerType type : c.layer_types)
      names.push_back(type == LayerType::sparse_attention ? family.sparse_attention_name : layer_type_name(type));
    json["layer_types"] = names;
  }
};

// Which layers get an MoE FFN: by the family's rule (Qwen's decoder_sparse_step + mlp_only_layers,
// else first_k_dense_replace) or Kimi's explicit `mlp_layer_types`. Written in the family's own
// fields, so transformers builds the same layers; mlp_layer_types when no rule gives the placement.
struct FfnPlacement {
  static void read(const FieldReader& fields, const Family& family, ModelConfig& c) {
    const int64_t L = c.num_hidden_layers;
    std::vector<FfnType>& types = c.mlp_layer_types;
    types.assign(L, FfnType::dense);
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
  }
  static void write(nlohmann::json& json, const Family& family, const ModelConfig& c) {
    if (c.num_experts == 0) return;  // every layer dense
    const int64_t L = c.num_hidden_layers;
    int64_t leading_dense = 0;
    while (leading_dense < L && !c.is_moe_layer(leading_dense)) ++leading_dense;
    bool prefix_rule = true;
    for (int64_t l = leading_dense; l < L; ++l) prefix_rule = prefix_rule && c.is_moe_layer(l);
    if (family.qwen_moe_placement) {
      nlohmann::json dense = nlohmann::json::array();
      for (int64_t l = 0; l < L; ++l)
        if (!c.is_moe_layer(l)) dense.push_back(l);
      json["decoder_sparse_step"] = 1;
      json["mlp_only_layers"] = dense;
    } else if (prefix_rule) {
      json["first_k_dense_replace"] = leading_dense;
    } else {
      nlohmann::json names = nlohmann::json::array();
      for (FfnType type : c.mlp_layer_types) names.push_back(ffn_type_name(type));
      json["mlp_layer_types"] = names;
    }
  }
};

// Settings that would change the model and are not built: errors, never silently another model.
void reject_unbuilt(const FieldReader& fields) {
  if (fields.boolean("use_sliding_window", false))
    fields.fail_field("use_sliding_window", "true: not built yet; expected false");
  for (const char* off : {"sliding_window", "max_window_layers"}) fields.has(off);  // the window's settings: unused while off
  if (fields.boolean("mlp_bias", false)) fields.fail_field("mlp_bias", "true: not built yet; expected false");
  const double dropout = fields.number("attention_dropout", 0.0);
  if (dropout != 0.0) fields.fail_field("attention_dropout", str_cat("got ", dropout, ": not built yet; expected 0"));
}

// The routed experts' fields (a config with num_experts > 0).
template <class Io, class Config>
void describe_moe(Io& io, const Family& family, Config& c) {
  const char* k_name = io.integer(c.num_experts_per_tok, {"num_experts_per_tok", "num_experts_per_token"},
                                  IntegerRule::non_negative, family.default_top_k);
  io.require(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, k_name, [&] {
    return str_cat("got ", c.num_experts_per_tok, "; expected 1 to num_experts = ", c.num_experts);
  });
  io.integer(c.moe_intermediate_size, "moe_intermediate_size", IntegerRule::non_negative, family.default_expert_width);
  io.require(c.moe_intermediate_size > 0, "moe_intermediate_size",
             [] { return std::string("expected a positive integer (num_experts > 0)"); });
  io.boolean(c.norm_topk_prob, {"norm_topk_prob", "moe_renormalize"}, family.default_norm_topk_prob);
  if (family.shared_expert_gated)
    io.integer(c.shared_expert_intermediate_size, "shared_expert_intermediate_size", IntegerRule::non_negative,
               family.default_shared_expert_width);
  if (family.router == RouterScoring::sigmoid) {
    io.integer(c.n_shared_experts, {"n_shared_experts", "num_shared_experts"}, IntegerRule::non_negative,
               family.default_shared_experts);
    io.number(c.routed_scaling_factor, "routed_scaling_factor", NumberRule::positive,
              family.default_routed_scaling_factor);
    const char* group_name = io.integer(c.n_group, {"n_group", "num_expert_group"}, IntegerRule::positive);
    io.integer(c.topk_group, "topk_group", IntegerRule::positive);
    const int64_t group_size = c.n_group > 0 ? c.num_experts / c.n_group : 0;
    io.require(group_size * c.n_group == c.num_experts && (c.n_group == 1 || group_size >= 2), group_name, [&] {
      return str_cat("got ", c.n_group, "; expected a divisor of num_experts = ", c.num_experts,
                     " leaving at least 2 experts per group");
    });
    io.require(c.topk_group <= c.n_group && c.topk_group * group_size >= c.num_experts_per_tok, "topk_group", [&] {
      return str_cat("got ", c.topk_group, "; expected at most ", c.n_group, " groups holding at least ",
                     "num_experts_per_tok = ", c.num_experts_per_tok, " experts");
    });
  }
  io.boolean(c.output_router_logits, "output_router_logits");
  io.number(c.router_aux_loss_coef, "router_aux_loss_coef", NumberRule::any, family.default_aux_loss_coef);
  io.require(c.router_aux_loss_coef >= 0.0, "router_aux_loss_coef",
             [&] { return str_cat("got ", c.router_aux_loss_coef, "; expected a value >= 0"); });
  io.choice(c.router_aux_loss_type, "router_aux_loss_type",
            {AuxLossType::pooled, AuxLossType::per_layer, AuxLossType::sequence}, aux_loss_type_name);
  // The Switch-style losses take P_e as a probability: sigmoid scores are not one (they would need
  // Megatron's per-token normalization); the sequence-wise loss normalizes them itself.
  io.require(family.router != RouterScoring::sigmoid || c.aux_loss_coef() == 0.0 ||
                 c.router_aux_loss_type == AuxLossType::sequence,
             "router_aux_loss_type", [&] {
               return str_cat("\"", aux_loss_type_name(c.router_aux_loss_type), "\" with a sigmoid router (",
                              c.model_type, "): not built; expected \"sequence\" (or router_aux_loss_coef 0)");
             });
  io.number(c.router_z_loss_coef, "router_z_loss_coef", NumberRule::any);
  io.require(c.router_z_loss_coef >= 0.0, "router_z_loss_coef",
             [&] { return str_cat("got ", c.router_z_loss_coef, "; expected a value >= 0"); });
  io.number(c.moe_capacity_factor, "moe_capacity_factor", NumberRule::any);
  io.require(c.moe_capacity_factor >= 0.0 && std::isfinite(c.moe_capacity_factor), "moe_capacity_factor", [&] {
    return str_cat("got ", c.moe_capacity_factor, "; expected 0 (dropless) or a positive number");
  });
}

// Multi-head latent attention's dims (transformers' DeepseekV3Config / KimiLinearConfig defaults
// when absent; q_lora_rank null means one q_proj).
template <class Io, class Config>
void describe_mla(Io& io, const Family& family, Config& c) {
  io.nullable_positive(c.q_lora_rank, "q_lora_rank", family.default_q_lora_rank);
  io.integer(c.kv_lora_rank, "kv_lora_rank", IntegerRule::positive, 512);
  io.integer(c.qk_nope_head_dim, "qk_nope_head_dim", IntegerRule::positive, 128);
  io.integer(c.qk_rope_head_dim, "qk_rope_head_dim", IntegerRule::positive, 64);
  io.integer(c.v_head_dim, "v_head_dim", IntegerRule::positive, 128);
  io.boolean_unless_fixed(c.rope_interleave, "rope_interleave", true, family.mla_always_interleaved);
  io.check([&](const FieldReader& fields) {  // transformers' derived field, when a file has it
    if (fields.has("qk_head_dim") && fields.integer("qk_head_dim", 0) != c.qk_head_dim())
      fields.fail_field("qk_head_dim", str_cat("got ", fields.integer("qk_head_dim", 0), "; expected qk_nope_head_dim + ",
                                               "qk_rope_head_dim = ", c.qk_head_dim()));
  });
  io.require(c.num_key_value_heads == c.num_attention_heads, "num_key_value_heads", [&] {
    return str_cat("got ", c.num_key_value_heads, "; expected num_attention_heads = ", c.num_attention_heads,
                   " (multi-head latent attention)");
  });
  io.require(!family.mla_rope || c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
             [&] { return str_cat("got ", c.qk_rope_head_dim, "; expected an even number"); });
}

// The linear-attention and sparse-attention sizes, checked against the layers that use them.
template <class Io, class Config>
void describe_attention_sizes(Io& io, const Family& family, Config& c) {
  if (family.linear_attention == LinearAttention::kimi_delta) {
    io.template structured<KimiLinearAttention>(family, c);
  } else {
    io.integer(c.linear_num_key_heads, "linear_num_key_heads", IntegerRule::non_negative);
    io.integer(c.linear_num_value_heads, "linear_num_value_heads", IntegerRule::non_negative);
    io.integer(c.linear_key_head_dim, "linear_key_head_dim", IntegerRule::non_negative);
    io.integer(c.linear_value_head_dim, "linear_value_head_dim", IntegerRule::non_negative);
    io.integer(c.linear_conv_kernel_dim, "linear_conv_kernel_dim", IntegerRule::positive);
  }
  if (uses(c.layer_types, LayerType::linear_attention)) {
    for (const auto& [name, value] : {std::pair{"linear_num_key_heads", c.linear_num_key_heads},
                                      std::pair{"linear_num_value_heads", c.linear_num_value_heads},
                                      std::pair{"linear_key_head_dim", c.linear_key_head_dim},
                                      std::pair{"linear_value_head_dim", c.linear_value_head_dim}})
      io.require(value > 0, name,
                 [] { return std::string("expected a positive integer (the config has linear_attention layers)"); });
  }
}

constexpr int64_t kMaxLayers = 16384;

// config.json's fields, declared once. Each line names a field (its aliases and the name it is
// written under), the member it fills, its rule and default (the member's initial value unless
// given), and, by the branch it sits in, when the family or the config has it. ConfigReader runs
// this to parse and validate a file, ConfigWriter to write one, so what is written reads back as the
// same config. Rules across fields are `require`s, checked when reading, in this order.
template <class Io, class Config>  // Config: ModelConfig to read into, const ModelConfig to write
void describe_config(Io& io, Config& c) {
  io.string(c.model_type, "model_type");
  io.require(is_known_model_type(c.model_type), "model_type", [&] {
    return str_cat("unknown model type \"", c.model_type, "\"; expected one of ", known_model_types());
  });
  const Family family = family_of(c.model_type);
  io.integer(c.vocab_size, "vocab_size", IntegerRule::required_positive);
  io.integer(c.hidden_size, "hidden_size", IntegerRule::required_positive);
  io.integer(c.num_hidden_layers, "num_hidden_layers", IntegerRule::required_positive);
  // Far above any published model (they have at most a few hundred), so that an absurd count is
  // refused here instead of building millions of layers.
  io.require(c.num_hidden_layers <= kMaxLayers, "num_hidden_layers",
             [&] { return str_cat("got ", c.num_hidden_layers, "; expected at most ", kMaxLayers); });
  io.integer(c.num_attention_heads, "num_attention_heads", IntegerRule::required_positive);
  io.integer(c.num_key_value_heads, "num_key_value_heads", IntegerRule::positive, c.num_attention_heads);
  io.require(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, "num_key_value_heads", [&] {
    return str_cat("got ", c.num_key_value_heads, "; expected a divisor of num_attention_heads = ",
                   c.num_attention_heads);
  });
  // transformers' default when absent: hidden_size // num_attention_heads (rounded down).
  io.integer(c.head_dim, "head_dim", IntegerRule::positive,
             c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  io.require(c.head_dim > 0, "head_dim", [&] {
    return str_cat("missing and hidden_size ", c.hidden_size, " < num_attention_heads ", c.num_attention_heads,
                   "; expected head_dim to be given");
  });
  io.integer(c.max_position_embeddings, {"max_position_embeddings", "model_max_length"}, IntegerRule::positive);
  io.number(c.rms_norm_eps, "rms_norm_eps", NumberRule::positive);
  io.template structured<RopeParameters>(family, c);
  if (family.mla) describe_mla(io, family, c);
  io.number(c.initializer_range, "initializer_range", NumberRule::positive);
  io.boolean(c.tie_word_embeddings, "tie_word_embeddings");
  io.boolean(c.attention_bias, "attention_bias");
  io.boolean_unless_fixed(c.use_qk_norm, "use_qk_norm", false, family.always_qk_norm);
  io.string(c.hidden_act, "hidden_act");
  io.require(c.hidden_act == "silu", "hidden_act",
             [&] { return str_cat("\"", c.hidden_act, "\": not built yet; expected \"silu\""); });
  io.check(reject_unbuilt);
  io.template structured<LayerTypes>(family, c);
  io.require(!family.mla || c.q_lora_rank > 0 || !uses(c.layer_types, LayerType::sparse_attention), "q_lora_rank", [] {
    return std::string("null; expected a positive integer (the indexer of sparse_attention layers reads the query "
                       "latent)");
  });
  describe_attention_sizes(io, family, c);

  io.integer(c.num_experts, {{"num_experts", "num_local_experts", "n_routed_experts"}, family.experts_field},
             IntegerRule::non_negative, family.default_experts);
  io.template structured<FfnPlacement>(family, c);
  if (c.num_experts > 0) describe_moe(io, family, c);
  bool any_dense = false;
  for (FfnType type : c.mlp_layer_types) any_dense = any_dense || type == FfnType::dense;
  io.integer(c.intermediate_size, "intermediate_size",
             any_dense ? IntegerRule::required_positive : IntegerRule::non_negative);

  io.integer(c.index_n_heads, "index_n_heads", IntegerRule::non_negative);
  io.integer(c.index_head_dim, "index_head_dim", IntegerRule::non_negative);
  io.integer(c.index_topk, "index_topk", IntegerRule::positive);
  if (uses(c.layer_types, LayerType::sparse_attention)) {
    for (const auto& [name, value] : {std::pair{"index_n_heads", c.index_n_heads},
                                      std::pair{"index_head_dim", c.index_head_dim}})
      io.require(value > 0, name,
                 [] { return std::string("expected a positive integer (the config has sparse_attention layers)"); });
  }
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
  ConfigReader reader(json, source);
  ModelConfig c;
  c.source = source;
  describe_config(reader, c);
  c.unread_fields = reader.unread();
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
  nlohmann::json json = nlohmann::json::object();
  ConfigWriter writer(json);
  describe_config(writer, *this);
  return json;
}

}  // namespace trillion
