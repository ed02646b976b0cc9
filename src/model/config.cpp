// ModelConfig parsing and validation (see config.h). Field names are the Hugging Face ones;
// unknown fields (architectures, torch_dtype, ...) are ignored and a JSON null counts as absent.
// Every error reads `SOURCE: field "NAME": PROBLEM; expected WHAT`.
#include "model/config.h"

#include <cmath>

#include "core/error.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

constexpr const char* kModelTypes[] = {"qwen3", "qwen3_next", "qwen3_moe", "deepseek_v32", "kimi"};
constexpr LayerType kLayerTypes[] = {LayerType::full_attention, LayerType::linear_attention,
                                     LayerType::sparse_attention};

std::string allowed_model_types() {
  std::string text;
  for (const char* type : kModelTypes) text += (text.empty() ? "" : ", ") + std::string(type);
  return text;
}

std::string allowed_layer_types() {
  std::string text;
  for (LayerType type : kLayerTypes) text += (text.empty() ? "" : ", ") + std::string(layer_type_name(type));
  return text;
}

// Typed access to the fields of one config object; every failure names the source and the field.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& json, const std::string& source) : json_(json), source_(source) {}

  bool has(const char* name) const { return json_.contains(name) && !json_.at(name).is_null(); }

  [[noreturn]] void fail_field(const std::string& name, const std::string& problem) const {
    fail(source_, ": field \"", name, "\": ", problem);
  }
  [[noreturn]] void fail_element(const std::string& name, size_t index, const std::string& problem) const {
    fail(source_, ": field \"", name, "\"[", index, "]: ", problem);
  }

  int64_t integer(const char* name, int64_t fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_number_integer()) fail_field(name, str_cat("got ", value.dump(), "; expected an integer"));
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail_field(name, str_cat("got ", value.dump(), "; expected an integer below 2^63"));
    return value.get<int64_t>();
  }
  int64_t required_positive(const char* name) const {
    if (!has(name)) fail_field(name, "missing; expected a positive integer");
    return positive(name, 0);
  }
  int64_t positive(const char* name, int64_t fallback) const {
    int64_t value = integer(name, fallback);
    if (has(name) && value <= 0) fail_field(name, str_cat("got ", value, "; expected a positive integer"));
    return value;
  }
  int64_t non_negative(const char* name, int64_t fallback) const {
    int64_t value = integer(name, fallback);
    if (value < 0) fail_field(name, str_cat("got ", value, "; expected a non-negative integer"));
    return value;
  }
  double number(const char* name, double fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_number()) fail_field(name, str_cat("got ", value.dump(), "; expected a number"));
    return value.get<double>();
  }
  double positive_number(const char* name, double fallback) const {
    double value = number(name, fallback);
    if (!(value > 0.0) || !std::isfinite(value))
      fail_field(name, str_cat("got ", value, "; expected a positive number"));
    return value;
  }
  bool boolean(const char* name, bool fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_boolean()) fail_field(name, str_cat("got ", value.dump(), "; expected true or false"));
    return value.get<bool>();
  }
  std::string string(const char* name, const std::string& fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_string()) fail_field(name, str_cat("got ", value.dump(), "; expected a string"));
    return value.get<std::string>();
  }
  const nlohmann::json& at(const char* name) const { return json_.at(name); }

 private:
  const nlohmann::json& json_;
  const std::string& source_;
};

std::vector<LayerType> parse_layer_types(const FieldReader& fields, int64_t num_layers) {
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
        if (list[i].is_string() && list[i].get<std::string>() == layer_type_name(type)) match = &type;
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
    layer_types.assign(static_cast<size_t>(num_layers), LayerType::full_attention);
  }
  return layer_types;
}

bool uses(const std::vector<LayerType>& layer_types, LayerType type) {
  for (LayerType t : layer_types)
    if (t == type) return true;
  return false;
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

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(std::floor(partial_rotary_factor * static_cast<double>(head_dim)));
}

ModelConfig ModelConfig::from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) fail(source, ": config is ", json.type_name(), "; expected a JSON object");
  const FieldReader fields(json, source);
  ModelConfig c;
  c.source = source;

  c.model_type = fields.string("model_type", c.model_type);
  bool known_model = false;
  for (const char* type : kModelTypes) known_model = known_model || c.model_type == type;
  if (!known_model)
    fields.fail_field("model_type", str_cat("unknown model type \"", c.model_type, "\"; expected one of ",
                                            allowed_model_types()));

  c.vocab_size = fields.required_positive("vocab_size");
  c.hidden_size = fields.required_positive("hidden_size");
  c.num_hidden_layers = fields.required_positive("num_hidden_layers");
  c.num_attention_heads = fields.required_positive("num_attention_heads");
  c.num_key_value_heads = fields.positive("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fields.fail_field("num_key_value_heads", str_cat("got ", c.num_key_value_heads, "; expected a divisor of ",
                                                     "num_attention_heads = ", c.num_attention_heads));
  if (!fields.has("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    fields.fail_field("head_dim", str_cat("missing and hidden_size ", c.hidden_size,
                                          " is not divisible by num_attention_heads ", c.num_attention_heads,
                                          "; expected head_dim to be given"));
  c.head_dim = fields.positive("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = fields.positive("max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = fields.positive_number("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = fields.positive_number("rope_theta", c.rope_theta);
  c.partial_rotary_factor = fields.positive_number("partial_rotary_factor", c.partial_rotary_factor);
  if (c.partial_rotary_factor > 1.0)
    fields.fail_field("partial_rotary_factor", str_cat("got ", c.partial_rotary_factor, "; expected a value in (0, 1]"));
  if (c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0)
    fields.fail_field("partial_rotary_factor",
                      str_cat("gives rotary dimension ", c.rotary_dim(), " of head_dim ", c.head_dim,
                              "; expected partial_rotary_factor · head_dim to be a positive even number"));
  c.initializer_range = fields.positive_number("initializer_range", c.initializer_range);
  c.tie_word_embeddings = fields.boolean("tie_word_embeddings", c.tie_word_embeddings);
  c.attention_bias = fields.boolean("attention_bias", c.attention_bias);
  if (c.attention_bias) fields.fail_field("attention_bias", "true is not supported; expected false");
  c.hidden_act = fields.string("hidden_act", c.hidden_act);
  if (fields.has("rope_scaling")) c.rope_scaling = fields.at("rope_scaling");
  c.use_sliding_window = fields.boolean("use_sliding_window", c.use_sliding_window);
  c.layer_types = parse_layer_types(fields, c.num_hidden_layers);

  c.linear_num_key_heads = fields.non_negative("linear_num_key_heads", 0);
  c.linear_num_value_heads = fields.non_negative("linear_num_value_heads", 0);
  c.linear_key_head_dim = fields.non_negative("linear_key_head_dim", 0);
  c.linear_value_head_dim = fields.non_negative("linear_value_head_dim", 0);
  c.linear_conv_kernel_dim = fields.positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  if (uses(c.layer_types, LayerType::linear_attention)) {
    for (const char* name : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                             "linear_value_head_dim"})
      if (fields.integer(name, 0) <= 0) fields.fail_field(name, "expected a positive integer (the config has linear_attention layers)");
  }

  if (fields.has("num_experts") && fields.has("n_routed_experts") &&
      fields.integer("num_experts", 0) != fields.integer("n_routed_experts", 0))
    fields.fail_field("n_routed_experts", str_cat("got ", fields.integer("n_routed_experts", 0),
                                                  "; expected it to equal num_experts = ", fields.integer("num_experts", 0)));
  c.num_experts = fields.non_negative(fields.has("num_experts") ? "num_experts" : "n_routed_experts", 0);
  c.num_experts_per_tok = fields.non_negative("num_experts_per_tok", 0);
  c.moe_intermediate_size = fields.non_negative("moe_intermediate_size", 0);
  c.shared_expert_intermediate_size = fields.non_negative("shared_expert_intermediate_size", 0);
  c.norm_topk_prob = fields.boolean("norm_topk_prob", c.norm_topk_prob);
  c.router_aux_loss_coef = fields.number("router_aux_loss_coef", c.router_aux_loss_coef);
  if (c.router_aux_loss_coef < 0.0)
    fields.fail_field("router_aux_loss_coef", str_cat("got ", c.router_aux_loss_coef, "; expected a value >= 0"));
  if (c.num_experts > 0) {
    if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)
      fields.fail_field("num_experts_per_tok", str_cat("got ", c.num_experts_per_tok, "; expected 1 to num_experts = ",
                                                       c.num_experts));
    if (c.moe_intermediate_size <= 0)
      fields.fail_field("moe_intermediate_size", "expected a positive integer (num_experts > 0)");
    c.intermediate_size = fields.non_negative("intermediate_size", 0);
  } else {
    c.intermediate_size = fields.required_positive("intermediate_size");
  }

  c.index_n_heads = fields.non_negative("index_n_heads", 0);
  c.index_head_dim = fields.non_negative("index_head_dim", 0);
  c.index_topk = fields.positive("index_topk", c.index_topk);
  if (uses(c.layer_types, LayerType::sparse_attention)) {
    for (const char* name : {"index_n_heads", "index_head_dim"})
      if (fields.integer(name, 0) <= 0) fields.fail_field(name, "expected a positive integer (the config has sparse_attention layers)");
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": not valid JSON: ", error.what());
  }
  return from_json(json, path);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json layer_names = nlohmann::json::array();
  for (LayerType type : layer_types) layer_names.push_back(layer_type_name(type));
  return {
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
      {"rope_theta", rope_theta},
      {"partial_rotary_factor", partial_rotary_factor},
      {"initializer_range", initializer_range},
      {"tie_word_embeddings", tie_word_embeddings},
      {"attention_bias", attention_bias},
      {"hidden_act", hidden_act},
      {"rope_scaling", rope_scaling},
      {"use_sliding_window", use_sliding_window},
      {"layer_types", layer_names},
      {"linear_num_key_heads", linear_num_key_heads},
      {"linear_num_value_heads", linear_num_value_heads},
      {"linear_key_head_dim", linear_key_head_dim},
      {"linear_value_head_dim", linear_value_head_dim},
      {"linear_conv_kernel_dim", linear_conv_kernel_dim},
      {"num_experts", num_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"moe_intermediate_size", moe_intermediate_size},
      {"shared_expert_intermediate_size", shared_expert_intermediate_size},
      {"norm_topk_prob", norm_topk_prob},
      {"router_aux_loss_coef", router_aux_loss_coef},
      {"index_n_heads", index_n_heads},
      {"index_head_dim", index_head_dim},
      {"index_topk", index_topk},
  };
}

}  // namespace trillion
