// adapter_config.json's reader and writer and PEFT's matching rules (see lora_config.h). Errors read
// `SOURCE: field "NAME": PROBLEM; expected WHAT`, as the model config's.
#include "model/lora_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regex.h"
#include "io/atomic_file.h"
#include "model/config_fields.h"

namespace trillion {
namespace {

using config_detail::FieldReader;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Python's re.fullmatch(pattern, text); the pattern was checked to compile when read.
bool full_match(const std::string& pattern, const std::string& text) {
  return Regex(pattern, "pattern \"" + pattern + "\"").full_match(text);
}

// A list of strings, or null / absent (empty).
std::vector<std::string> string_list(const FieldReader& fields, const char* name) {
  std::vector<std::string> values;
  if (!fields.has(name)) return values;
  const nlohmann::json& list = fields.at(name);
  if (!list.is_array()) fields.fail_field(name, str_cat("got ", list.dump(), "; expected an array of strings or null"));
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) fields.fail_element(name, i, str_cat("got ", list[i].dump(), "; expected a string"));
    values.push_back(list[i].get<std::string>());
  }
  return values;
}

// PEFT's two forms: one regular expression (a string) or names (an array of strings).
ModuleNames module_names(const FieldReader& fields, const char* name) {
  ModuleNames names;
  if (!fields.has(name)) return names;
  const nlohmann::json& value = fields.at(name);
  if (value.is_string()) {
    names.pattern = value.get<std::string>();
    Regex(*names.pattern, str_cat(fields.source(), ": field \"", name, "\""));  // compiles, or fails naming it
    return names;
  }
  names.names = string_list(fields, name);
  return names;
}

// {pattern: value} in file order (`ordered`: the same object with its keys in file order, since
// the first matching pattern wins); each pattern must compile inside (.*\.)?(P)$.
template <class Value, class Read>
std::vector<std::pair<std::string, Value>> pattern_map(const FieldReader& fields, const nlohmann::ordered_json& ordered,
                                                       const char* name, Read read) {
  std::vector<std::pair<std::string, Value>> entries;
  if (!fields.has(name)) return entries;
  const nlohmann::ordered_json& object = ordered.at(name);
  if (!object.is_object()) fields.fail_field(name, str_cat("got ", object.dump(), "; expected an object {pattern: value}"));
  for (const auto& [pattern, value] : object.items()) {
    Regex("(.*\\.)?(" + pattern + ")$", str_cat(fields.source(), ": field \"", name, "\" key \"", pattern, "\""));
    entries.emplace_back(pattern, read(pattern, nlohmann::json::parse(value.dump())));
  }
  return entries;
}

// A field PEFT has and the engine does not do: accepted absent, null, or at the value `off` that
// means "not used" (off null: any empty value, [] or {}).
void refuse_unless(const FieldReader& fields, const char* name, const nlohmann::json& off, const char* what) {
  if (!fields.has(name)) return;
  const nlohmann::json& value = fields.at(name);
  if (off.is_null() ? !value.empty() : value != off)
    fields.fail_field(name, str_cat("got ", value.dump(), "; expected ", off.dump(), " (the engine does not implement ",
                                    what, ")"));
}

// Fields of adapter_config.json that describe the file or PEFT's runtime, not the adapter.
constexpr const char* kIgnoredFields[] = {"inference_mode", "revision", "auto_mapping", "peft_version",
                                          "megatron_core", "qalora_group_size", "runtime_config"};

}  // namespace

bool names_module(const std::string& name, const std::string& module) {
  return module == name || ends_with(module, "." + name);
}

bool ModuleNames::all_linear() const {
  if (!pattern || pattern->size() != std::string_view("all-linear").size()) return false;
  std::string lower = *pattern;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "all-linear";
}

bool ModuleNames::matches(const std::string& module) const {
  if (all_linear()) return module != kOutputLayer;
  if (pattern) return full_match(*pattern, module);
  for (const std::string& name : names)
    if (names_module(name, module)) return true;
  return false;
}

bool LoraConfig::targets_module(const std::string& module) const {
  // A module to save, or one inside it, never carries an adapter (PEFT: (^|.*\.)NAME($|\..*)).
  for (const std::string& name : modules_to_save)
    if (Regex("(^|.*\\.)" + name + "($|\\..*)", name).full_match(module)) return false;
  return !exclude_modules.matches(module) && target_modules.matches(module);
}

bool LoraConfig::targets_parameter(const std::string& parameter) const {
  for (const std::string& name : target_parameters)
    if (names_module(name, parameter)) return true;
  return false;
}

bool LoraConfig::saves_module(const std::string& module) const {
  // PEFT's _set_trainable wraps every module whose name ends with an entry, so a tensor trains when
  // its module or any module above it ("model.layers.0.mlp" above "…mlp.down_proj") does.
  for (size_t end = module.size(); end != std::string::npos && end > 0; end = module.rfind('.', end - 1)) {
    const std::string ancestor = module.substr(0, end);
    for (const std::string& name : modules_to_save)
      if (ends_with(ancestor, name)) return true;
  }
  return false;
}

namespace {

// PEFT's get_pattern_key over one pattern map: the value of the first key P (file order) for which
// the name matches (.*\.)?(P)$, else `fallback`. Ranks and alphas are looked up apart (peft
// 0.21's LoraModel._create_and_replace).
template <class Value>
Value pattern_value(const std::vector<std::pair<std::string, Value>>& patterns, const std::string& name,
                    Value fallback) {
  for (const auto& [key, value] : patterns)
    if (pattern_key_matches(key, name)) return value;
  return fallback;
}

}  // namespace

bool pattern_key_matches(const std::string& key, const std::string& name) {
  return Regex("(.*\\.)?(" + key + ")$", key).full_match(name);
}

int64_t LoraConfig::rank_of(const std::string& name) const { return pattern_value(rank_pattern, name, r); }

double LoraConfig::alpha_of(const std::string& name) const { return pattern_value(alpha_pattern, name, lora_alpha); }

double LoraConfig::scaling_of(const std::string& name) const {
  const double rank = double(rank_of(name));
  return alpha_of(name) / (use_rslora ? std::sqrt(rank) : rank);
}

LoraConfig LoraConfig::from_json(const nlohmann::ordered_json& ordered, const std::string& source) {
  if (!ordered.is_object()) fail(source, ": adapter config is ", ordered.type_name(), "; expected a JSON object");
  const nlohmann::json json = nlohmann::json::parse(ordered.dump());
  FieldReader fields(json, source);
  LoraConfig c;
  c.source = source;
  const std::string peft_type = fields.string("peft_type", "LORA");
  if (peft_type != "LORA") fields.fail_field("peft_type", str_cat("got \"", peft_type, "\"; expected \"LORA\""));
  c.r = fields.positive("r", c.r);
  c.lora_alpha = fields.number("lora_alpha", c.lora_alpha);
  if (!std::isfinite(c.lora_alpha)) fields.fail_field("lora_alpha", "got a non-finite value; expected a number");
  c.use_rslora = fields.boolean("use_rslora", c.use_rslora);
  c.lora_dropout = fields.number("lora_dropout", c.lora_dropout);
  if (!(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0))
    fields.fail_field("lora_dropout", str_cat("got ", c.lora_dropout, "; expected a probability in [0, 1)"));
  c.target_modules = module_names(fields, "target_modules");
  c.exclude_modules = module_names(fields, "exclude_modules");
  c.target_parameters = string_list(fields, "target_parameters");
  if (c.target_modules.empty() && c.target_parameters.empty())
    fields.fail_field("target_modules", "and target_parameters are both empty; expected the modules or parameters "
                                        "to adapt (e.g. [\"q_proj\", \"v_proj\"])");
  c.rank_pattern = pattern_map<int64_t>(fields, ordered, "rank_pattern", [&](const std::string& key, const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      fields.fail_field("rank_pattern", str_cat("key \"", key, "\": got ", v.dump(), "; expected a positive integer"));
    return v.get<int64_t>();
  });
  c.alpha_pattern = pattern_map<double>(fields, ordered, "alpha_pattern", [&](const std::string& key, const nlohmann::json& v) {
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      fields.fail_field("alpha_pattern", str_cat("key \"", key, "\": got ", v.dump(), "; expected a number"));
    return v.get<double>();
  });
  c.modules_to_save = string_list(fields, "modules_to_save");
  for (size_t i = 0; i < c.modules_to_save.size(); ++i)  // PEFT reads each as a pattern too (targets_module)
    Regex("(^|.*\\.)" + c.modules_to_save[i] + "($|\\..*)", str_cat(source, ": field \"modules_to_save\"[", i, "]"));
  c.base_model_name_or_path = fields.string("base_model_name_or_path", "");
  c.task_type = fields.string("task_type", "");

  // What PEFT can express and the engine does not do.
  refuse_unless(fields, "bias", "none", "trained biases");
  refuse_unless(fields, "use_dora", false, "DoRA");
  refuse_unless(fields, "fan_in_fan_out", false, "Conv1D-layout weights");
  refuse_unless(fields, "init_lora_weights", true, "initializations other than A kaiming-uniform, B zero");
  refuse_unless(fields, "lora_bias", false, "a bias on lora_B");
  refuse_unless(fields, "use_qalora", false, "QALoRA");
  refuse_unless(fields, "use_bdlora", false, "BD-LoRA");
  refuse_unless(fields, "ensure_weight_tying", false, "tying saved modules");
  refuse_unless(fields, "loftq_config", nullptr, "LoftQ");
  for (const char* name : {"layers_to_transform", "layers_pattern", "layer_replication", "trainable_token_indices",
                           "alora_invocation_tokens", "arrow_config", "eva_config", "corda_config", "megatron_config",
                           "kasa_config", "lora_ga_config", "monteclora_config", "velora_config"})
    refuse_unless(fields, name, nullptr, name);
  for (const char* name : kIgnoredFields) fields.has(name);

  std::string unread;
  for (const std::string& name : fields.unread()) unread += (unread.empty() ? "" : ", ") + name;
  if (!unread.empty())
    std::fprintf(stderr, "warning: %s: fields the engine does not read: %s\n", source.c_str(), unread.c_str());
  return c;
}

namespace {

// "a,b,,c" → {a, b, c}
std::vector<std::string> comma_separated(const std::string& list) {
  std::vector<std::string> names;
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    if (end > begin) names.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return names;
}

}  // namespace

LoraConfig LoraConfig::from_flags(int64_t r, double lora_alpha, const std::string& targets,
                                  const std::string& target_parameters) {
  nlohmann::ordered_json json = {{"r", r}, {"lora_alpha", lora_alpha}, {"task_type", "CAUSAL_LM"}};
  if (ModuleNames{{}, targets}.all_linear())
    json["target_modules"] = targets;
  else
    json["target_modules"] = comma_separated(targets);
  if (!target_parameters.empty()) json["target_parameters"] = comma_separated(target_parameters);
  return from_json(json, "--lora-rank / --lora-alpha / --lora-targets / --lora-target-parameters");
}

std::optional<LoraConfig> LoraOptions::config() const {
  if (rank < 0) fail("--lora-rank ", rank, ": expected a positive rank");
  const int chosen = (rank > 0) + !config_path.empty() + !adapter_dir.empty();
  if (chosen > 1) fail("--lora-rank, --lora-config and --adapter are exclusive: expected one of them");
  if (chosen == 0) return std::nullopt;
  if (!adapter_dir.empty()) return LoraConfig::load(adapter_dir + "/adapter_config.json");
  if (!config_path.empty()) return LoraConfig::load(config_path);
  return LoraConfig::from_flags(rank, alpha, targets, target_parameters);
}

LoraConfig LoraConfig::load(const std::string& path) {
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(read_file(path));
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": not valid JSON: ", error.what());
  }
  return from_json(json, path);
}

nlohmann::ordered_json LoraConfig::to_json() const {
  using Json = nlohmann::ordered_json;
  const auto module_list = [](const ModuleNames& names) {
    if (names.pattern) return Json(*names.pattern);
    return names.names.empty() ? Json(nullptr) : Json(names.names);
  };
  Json json = Json::object();
  json["peft_type"] = "LORA";
  json["task_type"] = task_type.empty() ? Json(nullptr) : Json(task_type);
  json["base_model_name_or_path"] = base_model_name_or_path.empty() ? Json(nullptr)
                                                                    : Json(base_model_name_or_path);
  json["inference_mode"] = true;
  json["r"] = r;
  json["lora_alpha"] = lora_alpha;
  json["use_rslora"] = use_rslora;
  json["lora_dropout"] = lora_dropout;
  json["target_modules"] = module_list(target_modules);
  json["exclude_modules"] = module_list(exclude_modules);
  json["target_parameters"] = target_parameters.empty() ? Json(nullptr) : Json(target_parameters);
  json["rank_pattern"] = Json::object();
  for (const auto& [pattern, rank] : rank_pattern) json["rank_pattern"][pattern] = rank;
  json["alpha_pattern"] = Json::object();
  for (const auto& [pattern, alpha] : alpha_pattern) json["alpha_pattern"][pattern] = alpha;
  json["modules_to_save"] = modules_to_save.empty() ? Json(nullptr) : Json(modules_to_save);
  json["bias"] = "none";
  json["use_dora"] = false;
  json["fan_in_fan_out"] = false;
  json["init_lora_weights"] = true;
  return json;
}

void LoraConfig::save(const std::string& path) const { write_file_atomic(path, to_json().dump(2) + "\n"); }

}  // namespace trillion
