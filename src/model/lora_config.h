// PEFT's LoraConfig, as adapter_config.json stores it: which linear weights of a model carry a
// LoRA adapter, with what rank and scaling, and which whole modules train beside them. The
// matching rules are PEFT's own (peft/tuners/tuners_utils.py, check_target_module_exists; the
// patterns' get_pattern_key), applied to Hugging Face module names ("model.layers.3.self_attn.q_proj",
// a parameter table tensor's name without ".weight"):
//
//   target_modules, a list   a module matches a name equal to its own or ending with ".NAME"
//   target_modules, a string a regular expression that must match the whole module name; the
//                            string "all-linear": every linear layer but the output layer (lm_head)
//   exclude_modules          the same two forms; an excluded module never matches
//   target_parameters        a list of parameter names ("…mlp.experts.gate_up_proj"), same rule
//   rank_pattern, alpha_pattern  {pattern: value}: the first pattern P (file order) for which the
//                            name matches (.*\.)?(P)$ sets that module's rank or alpha
//   modules_to_save          whole modules trained and saved under their own keys: a module whose
//                            name ends with one of these, and every module inside it, which then
//                            carries no adapter
//
// scaling = lora_alpha / r, or lora_alpha / √r with use_rslora. What PEFT can express and the engine
// does not do (DoRA, biases, other initializations, layer selection by index, …) is refused with a
// one-line error naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace trillion {

// One of PEFT's two forms of a module list: names (equal, or a ".NAME" suffix) or one regular
// expression matching the whole name.
struct ModuleNames {
  std::vector<std::string> names;
  std::optional<std::string> pattern;  // set: the string form
  bool empty() const { return names.empty() && !pattern; }
  bool all_linear() const;  // PEFT's shorthand "all-linear", in any case
  // Callers ask about linear modules only, so "all-linear" matches any name but the output layer's.
  bool matches(const std::string& module) const;
};

// Whether the list entry `name` names `module`: equal to it, or `module` ends with ".name" (PEFT's
// list form).
bool names_module(const std::string& name, const std::string& module);

// Whether the rank_pattern / alpha_pattern key `key` gives `name` its value: the name matches (.*\.)?(KEY)$.
bool pattern_key_matches(const std::string& key, const std::string& name);

// The output layer's module name, which "all-linear" leaves out (PEFT: the output embeddings).
inline constexpr const char* kOutputLayer = "lm_head";

struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8.0;
  bool use_rslora = false;
  double lora_dropout = 0.0;  // on the adapter's input in training, as PEFT (model/linear.h LoraDropoutPass)
  ModuleNames target_modules;
  ModuleNames exclude_modules;
  std::vector<std::string> target_parameters;
  std::vector<std::pair<std::string, int64_t>> rank_pattern;  // file order
  std::vector<std::pair<std::string, double>> alpha_pattern;  // file order
  std::vector<std::string> modules_to_save;
  std::string base_model_name_or_path;
  std::string task_type;  // kept for the written file ("CAUSAL_LM" by default)
  std::string source = "the LoRA config";  // the file it was read from, named in errors (not written)

  // Whether the linear module `module` carries an adapter (through target_modules).
  bool targets_module(const std::string& module) const;
  // Whether the parameter `parameter` (a fused expert weight) carries one (through target_parameters).
  bool targets_parameter(const std::string& parameter) const;
  // Whether the module `module` is trained and saved whole (it, or a module above it, is listed).
  bool saves_module(const std::string& module) const;
  // The rank, alpha and scaling of the adapter on `name` (a module, or a target parameter).
  int64_t rank_of(const std::string& name) const;
  double alpha_of(const std::string& name) const;
  double scaling_of(const std::string& name) const;

  // The config of the command line's --lora-rank R --lora-alpha A --lora-targets T
  // --lora-target-parameters P: T names comma-separated ("q_proj,v_proj") or all-linear, P names
  // comma-separated ("gate_up_proj,down_proj": the routed experts, PEFT's fused layout); checked as
  // a file's would be.
  static LoraConfig from_flags(int64_t r, double lora_alpha, const std::string& targets,
                               const std::string& target_parameters = "");
  // Reads adapter_config.json's object (keys in file order: the first matching pattern wins);
  // `source` names the file in errors.
  static LoraConfig from_json(const nlohmann::ordered_json& json, const std::string& source);
  static LoraConfig load(const std::string& path);  // OUT/adapter/adapter_config.json
  // The object PEFT reads back as this config (and from_json as the same one).
  nlohmann::ordered_json to_json() const;
  void save(const std::string& path) const;  // atomically
};

// The adapter a command line asks for (train, info), by one of: flags (rank > 0, alpha, targets:
// names comma-separated or all-linear, target_parameters: the routed experts' stacked weights
// comma-separated), a PEFT adapter_config.json (config_path), or an adapter directory (its
// adapter_config.json, and for training its weights).
struct LoraOptions {
  int64_t rank = 0;
  double alpha = 8.0;
  std::string targets = "all-linear";
  std::string target_parameters;
  std::string config_path;
  std::string adapter_dir;
  bool given() const { return rank != 0 || !config_path.empty() || !adapter_dir.empty(); }
  // The config they describe, or nullopt when none; fails when more than one way is given.
  std::optional<LoraConfig> config() const;
};

}  // namespace trillion
