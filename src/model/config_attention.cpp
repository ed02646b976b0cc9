// ModelConfig's structured attention fields (config_fields.h): RoPE with YaRN scaling from
// `rope_parameters` / `rope_scaling`, Kimi-Linear's linear-attention names and linear_attn_config;
// the RoPE a layer builds from them; and the count of sparse attention layers.
#include <algorithm>
#include <map>
#include <utility>

#include "model/config_fields.h"

namespace trillion {
namespace config_detail {
namespace {

// YaRN's settings inside a rope_parameters / rope_scaling dict.
void parse_yarn(const FieldReader& sub, RopeScaling& y) {
  if (sub.has("factor")) y.factor = sub.positive_number("factor", 1.0);
  if (sub.has("original_max_position_embeddings"))
    y.original_max_position_embeddings = sub.positive_number("original_max_position_embeddings", 1.0);
  y.beta_fast = sub.positive_number("beta_fast", y.beta_fast);
  y.beta_slow = sub.positive_number("beta_slow", y.beta_slow);
  y.mscale = sub.number("mscale", y.mscale);
  y.mscale_all_dim = sub.number("mscale_all_dim", y.mscale_all_dim);
  if (sub.has("attention_factor")) y.attention_factor = sub.positive_number("attention_factor", 1.0);
  y.truncate = sub.boolean("truncate", y.truncate);
  if (y.original_max_position_embeddings <= 0.0)
    sub.fail_field("original_max_position_embeddings", "missing; expected a positive number (rope_type \"yarn\")");
}

}  // namespace

void RopeParameters::read(const FieldReader& fields, const Family& family, ModelConfig& c) {
  c.rope_theta = fields.positive_number("rope_theta", c.rope_theta);
  c.partial_rotary_factor = fields.positive_number("partial_rotary_factor", family.default_partial_rotary_factor);
  // Where each value came from: the first source that gave it; every later one must agree.
  std::map<std::string, std::string> given_by;
  for (const char* key : {"rope_theta", "partial_rotary_factor"})
    if (fields.has(key)) given_by[key] = key;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    if (!fields.has(name)) continue;
    const nlohmann::json& params = fields.at(name);
    if (!params.is_object()) fields.fail_field(name, str_cat("got ", params.dump(), "; expected an object"));
    const std::string source = str_cat(fields.source(), ": ", name);
    const FieldReader sub(params, source);
    const std::string type = sub.string(sub.alias({"rope_type", "type"}), "default");
    if (type != "default" && type != "yarn")
      fields.fail_field(name, str_cat("rope_type \"", type, "\": not built yet; expected \"default\" or \"yarn\""));
    if (type == "yarn") {
      if (c.rope_scaling.type == "yarn" && given_by.count("yarn") != 0 && params != fields.at(given_by["yarn"].c_str()))
        fields.fail_field(name, str_cat("differs from ", given_by["yarn"], "; expected one YaRN setting"));
      c.rope_scaling.type = "yarn";
      given_by["yarn"] = name;
      parse_yarn(sub, c.rope_scaling);
    }
    for (const auto& [key, top] : {std::pair{"rope_theta", &c.rope_theta},
                                   std::pair{"partial_rotary_factor", &c.partial_rotary_factor}}) {
      if (!sub.has(key)) continue;
      const double value = sub.positive_number(key, *top);
      if (given_by.count(key) != 0 && value != *top)
        fields.fail_field(given_by[key], str_cat("got ", *top, " but ", name, ".", key, " = ", value,
                                                 "; expected one value (or only one of them)"));
      if (given_by.count(key) == 0) given_by[key] = str_cat(name, ".", key);
      *top = value;
    }
    for (const std::string& key : sub.unread())
      fields.fail_field(name, str_cat("has \"", key, "\", which rope_type \"", type, "\" does not take; expected only ",
                                      type == "yarn" ? "rope_type, rope_theta, partial_rotary_factor, factor, "
                                                       "original_max_position_embeddings, beta_fast, beta_slow, "
                                                       "mscale, mscale_all_dim, attention_factor, truncate"
                                                     : "rope_type, rope_theta, partial_rotary_factor"));
  }
  if (c.partial_rotary_factor > 1.0)
    fields.fail_field("partial_rotary_factor", str_cat("got ", c.partial_rotary_factor, "; expected a value in (0, 1]"));
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.factor == 0.0)  // transformers' rule for an absent factor
    c.rope_scaling.factor =
        static_cast<double>(c.max_position_embeddings) / c.rope_scaling.original_max_position_embeddings;
}

void RopeParameters::write(nlohmann::json& json, const Family&, const ModelConfig& c) {
  nlohmann::json& rope = json["rope_parameters"];
  rope = {{"rope_type", c.rope_scaling.type}, {"rope_theta", c.rope_theta},
          {"partial_rotary_factor", c.partial_rotary_factor}};
  if (c.rope_scaling.type != "yarn") return;
  const RopeScaling& y = c.rope_scaling;
  rope.update({{"factor", y.factor}, {"original_max_position_embeddings", y.original_max_position_embeddings},
               {"beta_fast", y.beta_fast}, {"beta_slow", y.beta_slow}, {"truncate", y.truncate}});
  if (y.mscale != 0.0) rope["mscale"] = y.mscale;
  if (y.mscale_all_dim != 0.0) rope["mscale_all_dim"] = y.mscale_all_dim;
  if (y.attention_factor > 0.0) rope["attention_factor"] = y.attention_factor;
}

void KimiLinearAttention::read(const FieldReader& fields, const Family&, ModelConfig& c) {
  int64_t heads = fields.non_negative("linear_num_heads", 0), dim = fields.non_negative("linear_head_dim", 0);
  c.linear_conv_kernel_dim = fields.positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  if (fields.has("linear_attn_config")) {
    const nlohmann::json& block = fields.at("linear_attn_config");
    if (!block.is_object()) fields.fail_field("linear_attn_config", str_cat("got ", block.dump(), "; expected an object"));
    const std::string source = str_cat(fields.source(), ": linear_attn_config");
    const FieldReader sub(block, source);
    heads = sub.positive("num_heads", heads);
    dim = sub.positive("head_dim", dim);
    c.linear_conv_kernel_dim = sub.positive("short_conv_kernel_size", c.linear_conv_kernel_dim);
    const std::vector<int64_t> full = sub.integer_list("full_attn_layers"), kda = sub.integer_list("kda_layers");
    if (!full.empty() || !kda.empty()) {
      std::vector<int> seen(c.num_hidden_layers, 0);
      for (const auto& [list, type] : {std::pair{&full, LayerType::full_attention},
                                       std::pair{&kda, LayerType::linear_attention}}) {
        for (int64_t one_based : *list) {
          if (one_based < 1 || one_based > c.num_hidden_layers)
            sub.fail_field(type == LayerType::full_attention ? "full_attn_layers" : "kda_layers",
                           str_cat("has layer ", one_based, "; expected 1-indexed layers in [1, ", c.num_hidden_layers, "]"));
          // full_attn_layers names the softmax layers, dense or sparse: layer_types, when given,
          // says which (transformers' Kimi-Linear has none sparse) and must agree on the rest.
          LayerType& layer = c.layer_types[one_based - 1];
          const bool linear = layer == LayerType::linear_attention;
          if (fields.has("layer_types") && linear != (type == LayerType::linear_attention))
            sub.fail_field(type == LayerType::full_attention ? "full_attn_layers" : "kda_layers",
                           str_cat("has layer ", one_based, ", which layer_types names ", layer_type_name(layer),
                                   "; expected the two to agree"));
          if (!fields.has("layer_types")) layer = type;
          ++seen[one_based - 1];
        }
      }
      for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        if (seen[l] != 1)
          sub.fail_field("kda_layers", str_cat("layer ", l + 1, " is named ", seen[l], " times in full_attn_layers and ",
                                               "kda_layers; expected each layer exactly once"));
    }
    for (const std::string& key : sub.unread()) fields.add_unread("linear_attn_config." + key);
  }
  c.linear_num_key_heads = c.linear_num_value_heads = heads;
  c.linear_key_head_dim = c.linear_value_head_dim = dim;
}

void KimiLinearAttention::write(nlohmann::json& json, const Family&, const ModelConfig& c) {
  nlohmann::json kda = nlohmann::json::array(), full = nlohmann::json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    (c.layer_types[l] == LayerType::linear_attention ? kda : full).push_back(l + 1);
  nlohmann::json block = {{"short_conv_kernel_size", c.linear_conv_kernel_dim}, {"kda_layers", kda},
                          {"full_attn_layers", full}};
  if (c.linear_num_key_heads > 0) block["num_heads"] = c.linear_num_key_heads;  // 0: never given (no KDA layer)
  if (c.linear_key_head_dim > 0) block["head_dim"] = c.linear_key_head_dim;
  json["linear_attn_config"] = block;
}

}  // namespace config_detail

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(std::floor(partial_rotary_factor * static_cast<double>(head_dim)));
}

namespace {
// YaRN's magnitude correction 0.1 · m · ln(scale) + 1 (1 for scale ≤ 1).
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }
}  // namespace

RopeSpec ModelConfig::rope_spec(int64_t rotary_dim, bool interleaved) const {
  RopeSpec rope;
  rope.rotary_dim = rotary_dim;
  rope.theta = rope_theta;
  rope.interleaved = interleaved;
  if (rope_scaling.type != "yarn") return rope;
  const RopeScaling& y = rope_scaling;
  rope.yarn = {y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow, y.truncate};
  if (y.attention_factor > 0.0)
    rope.attention_factor = y.attention_factor;
  else if (y.mscale != 0.0 && y.mscale_all_dim != 0.0)
    rope.attention_factor = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  else
    rope.attention_factor = yarn_mscale(y.factor, 1.0);
  return rope;
}

double ModelConfig::yarn_softmax_factor() const {
  if (rope_scaling.type == "default" || rope_scaling.mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
  return m * m;
}

int64_t ModelConfig::sparse_layers() const {
  return std::count(layer_types.begin(), layer_types.end(), LayerType::sparse_attention);
}

}  // namespace trillion
