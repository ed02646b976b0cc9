// Routed experts' adapters converted between PEFT's layouts (see adapter_layout.h).
#include "model/adapter_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <string_view>

#include "core/error.h"
#include "model/family.h"

namespace trillion {
namespace {

constexpr std::string_view kPairA = ".lora_A.weight", kPairB = ".lora_B.weight";

// "…mlp.experts.gate_up_proj" → "gate_up_proj"
std::string leaf(const std::string& name) { return name.substr(name.rfind('.') + 1); }

// Routed experts' pair tensors ([E, …]) are those with three dimensions.
bool expert_pair(const ParamSpec& spec) { return spec.adapter && spec.shape.size() == 3; }

void add_once(std::vector<std::string>& list, const std::string& name) {
  if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : separator) + item;
  return joined;
}

// `name` as a regular expression matching itself: the ASCII metacharacters escaped.
std::string escaped(const std::string& name) {
  std::string pattern;
  for (const char c : name) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
    pattern += c;
  }
  return pattern;
}

// A module name as a pattern of that module in any layer: "model.layers.1.mlp.experts" →
// "model\.layers\.\d+\.mlp\.experts" (its first all-digit component generalized).
std::string any_layer(const std::string& module) {
  std::string pattern, component;
  bool generalized = false;
  for (size_t i = 0; i <= module.size(); ++i) {
    if (i < module.size() && module[i] != '.') {
      component += module[i];
      continue;
    }
    const bool index = !generalized && !component.empty() &&
                       std::all_of(component.begin(), component.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    pattern += (pattern.empty() ? "" : "\\.") + (index ? std::string("\\d+") : escaped(component));
    generalized = generalized || index;
    component.clear();
  }
  return pattern;
}

// PEFT's list of names as one regular expression of the same matches; a pattern as it is.
std::string as_pattern(const ModuleNames& names) {
  if (names.pattern) return *names.pattern;
  std::vector<std::string> escaped_names;
  for (const std::string& name : names.names) escaped_names.push_back(escaped(name));
  return "(?:.*\\.)?(?:" + join(escaped_names, "|") + ")";
}

// The routed experts' stacked weights ("…mlp.experts.gate_up_proj") and the pairs that change layout
// on them, with the patterns that name them: of any layer when every MoE layer's weight of that
// leaf carries such pairs, else exact.
struct ConvertedWeights {
  std::vector<const ParamSpec*> pairs;  // the A tensors of the routed experts' pairs that change layout
  std::set<std::string> leaves_everywhere;  // "gate_up_proj": every layer's carries pairs

  explicit ConvertedWeights(const ParamTable& table, bool to_per_expert) {
    std::set<std::string> adapted, leaves, partial;
    for (const ParamSpec& spec : table.entries())
      if (expert_pair(spec) && spec.name.ends_with(kPairA) && spec.adapter->whole_parameter == to_per_expert) {
        pairs.push_back(&spec);
        adapted.insert(spec.adapter->weight);
      }
    for (const ParamSpec& spec : table.entries()) {
      if (spec.group != ParamGroup::expert || spec.shape.size() != 3) continue;
      leaves.insert(leaf(spec.name));
      if (adapted.count(spec.name) == 0) partial.insert(leaf(spec.name));
    }
    for (const std::string& name : leaves)
      if (partial.count(name) == 0) leaves_everywhere.insert(name);
  }
  // "model.layers.1.mlp.experts.gate_up_proj" → its experts module as a pattern
  std::string container(const std::string& weight) const {
    const std::string module = weight.substr(0, weight.rfind('.'));
    return leaves_everywhere.count(leaf(weight)) ? any_layer(module) : escaped(module);
  }
  // A part's per-expert modules, indexed or not: "…experts\.(?:\d+\.)?gate_proj"
  std::string part_modules(const std::string& weight, const std::string& part) const {
    return container(weight) + "\\.(?:\\d+\\.)?" + escaped(part);
  }
  // The stacked weight as target_parameters and rank_pattern name it: its leaf, or its whole name.
  std::string parameter(const std::string& weight) const {
    return leaves_everywhere.count(leaf(weight)) ? leaf(weight) : weight;
  }
};

// The rows of each expert's weight that the pair of tensor `spec` adapts: its B's [E, rows, r].
int64_t pair_rows(const ParamTable& table, const ParamSpec& spec) {
  return table.find(pair_module(spec.name) + std::string(kPairB)).shape[1];
}

}  // namespace

ExpertLayout expert_layout_named(const std::string& name, const std::string& flag) {
  const std::vector<std::string>& names = expert_layout_names();
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) fail(flag, " ", name, ": expected as-trained, per-expert or fused");
  return static_cast<ExpertLayout>(it - names.begin());
}

std::optional<LoraConfig> lora_in_layout(const LoraConfig& lora, const ParamTable& table, ExpertLayout layout) {
  if (layout == ExpertLayout::as_trained) return std::nullopt;
  const bool to_per_expert = layout == ExpertLayout::per_expert;
  const ConvertedWeights converted(table, to_per_expert);
  const std::vector<const ParamSpec*>& pairs = converted.pairs;
  if (pairs.empty()) return std::nullopt;
  const std::string layout_flag = "--expert-layout " + expert_layout_names()[static_cast<int>(layout)];
  if (lora.target_modules.all_linear())
    fail(lora.source, ": field \"target_modules\": all-linear, which ", layout_flag, " cannot rewrite; expected names");
  // The per-expert modules of the converted pairs, of any expert and by the name without the index
  // PEFT (transformers 5) reads.
  std::vector<std::string> modules;
  for (const ParamSpec* a : pairs)
    for (const std::string& part : a->adapter->whole_parameter ? a->adapter->parts
                                                                : std::vector<std::string>{leaf(pair_module(a->name))})
      add_once(modules, converted.part_modules(a->adapter->weight, part));
  const std::string experts = "(?:" + join(modules, "|") + ")";
  bool other_pairs = false;  // modules other than the routed experts carry pairs
  for (const ParamSpec& spec : table.entries()) other_pairs = other_pairs || (spec.adapter && !expert_pair(spec));
  LoraConfig out = lora;
  ModuleNames& targets = out.target_modules;
  if (to_per_expert) {
    targets.pattern = !other_pairs ? experts : "(?:" + as_pattern(targets) + ")|" + experts;
    targets.names.clear();
    std::erase_if(out.target_parameters, [&](const std::string& entry) {
      return std::any_of(pairs.begin(), pairs.end(), [&](const ParamSpec* a) { return names_module(entry, a->adapter->weight); });
    });
    // Patterns that gave the stacked weights their rank and alpha, and no adapted module, go with them.
    const auto stale = [&](const std::string& key) {
      const auto names_key = [&](const std::string& name) { return pattern_key_matches(key, name); };
      bool weights = false, others = false;
      for (const ParamSpec* a : pairs) weights = weights || names_key(a->adapter->weight);
      for (const ParamSpec& spec : table.entries())
        others = others || (spec.adapter && !expert_pair(spec) && names_key(pair_module(spec.name)));
      return weights && !others;
    };
    std::erase_if(out.rank_pattern, [&](const auto& entry) { return stale(entry.first); });
    std::erase_if(out.alpha_pattern, [&](const auto& entry) { return stale(entry.first); });
  } else if (!other_pairs) {  // every pair is the routed experts': target_parameters name them all
    targets = {};
  } else if (targets.pattern) {
    targets.pattern = "(?!" + experts + "$)(?:" + *targets.pattern + ")";
  } else {  // PEFT's own rewrite: the names that match per-expert modules become target_parameters
    std::erase_if(targets.names, [&](const std::string& entry) {
      return std::any_of(pairs.begin(), pairs.end(), [&](const ParamSpec* a) { return names_module(entry, pair_module(a->name)); });
    });
  }
  // Each written pair keeps its rank and scaling: a pattern pins them where the config would give
  // others (PEFT's ".*\.gate_up_proj": 2 r, alpha 2 lora_alpha for gate and up fused).
  const auto pin = [&](const std::string& key, const std::string& name, int64_t rank, double alpha) {
    if (out.rank_of(name) == rank && out.alpha_of(name) == alpha) return;
    std::erase_if(out.rank_pattern, [&](const auto& entry) { return entry.first == key; });
    std::erase_if(out.alpha_pattern, [&](const auto& entry) { return entry.first == key; });
    out.rank_pattern.insert(out.rank_pattern.begin(), {key, rank});
    out.alpha_pattern.insert(out.alpha_pattern.begin(), {key, alpha});
  };
  for (const ParamSpec* a : pairs) {
    const std::string& weight = a->adapter->weight;
    const std::string container = weight.substr(0, weight.rfind('.'));
    if (to_per_expert) {
      for (const std::string& part : a->adapter->parts)
        pin(converted.part_modules(weight, part), container + ".0." + part, a->shape[1], lora.alpha_of(weight));
      continue;
    }
    add_once(out.target_parameters, converted.parameter(weight));
    int64_t rank = 0;  // the parts' ranks side by side, and their alphas summed (the same scaling)
    double alpha = 0.0;
    for (const ParamSpec* other : pairs)
      if (other->adapter->weight == weight) {
        rank += other->shape[1];
        alpha += lora.alpha_of(container + ".0." + leaf(pair_module(other->name)));
      }
    if (lora.use_rslora) alpha = a->adapter->scaling * std::sqrt(double(rank));
    const std::string parameter = converted.parameter(weight);
    pin(parameter == weight ? escaped(weight) : ".*\\." + parameter, weight, rank, alpha);
  }
  return out;
}

void check_peft_reads_it_alike(const LoraConfig& lora, const ParamTable& table, const std::string& model_type) {
  if (lora.target_modules.all_linear())
    fail(lora.source, ": field \"target_modules\": all-linear on an MoE model, which PEFT extends to the router ",
         "(not adapted here); expected the projections by name and the routed experts as target_parameters");
  struct PartPair {
    int64_t rank = 0;
    double scaling = 0.0;
    bool fused_by_peft = false;  // gate or up: PEFT fuses them into one pair
    std::string other;           // up for gate, gate for up
  };
  std::map<std::string, PartPair> expert_parts;  // "…mlp.experts.gate_proj" → its pair: the parts adapted per expert
  for (const ParamSpec& spec : table.entries()) {
    if (!spec.adapter || !spec.name.ends_with(kPairA)) continue;
    const std::string module = pair_module(spec.name), last = leaf(module);
    if (expert_pair(spec)) {
      const std::vector<std::string>& parts = spec.adapter->parts;
      if (spec.adapter->whole_parameter) continue;
      const bool fused = parts.size() == 2;
      expert_parts[module] = {spec.shape[1], spec.adapter->scaling, fused, fused ? parts[last == parts[0]] : ""};
      continue;
    }
    if (last == "gate_proj" || last == "up_proj" || last == "down_proj" || last == "gate")
      fail(lora.source, ": field \"target_modules\": matches ", module, "; on an MoE model PEFT reads ", last,
           " as the routed experts' target_parameters and leaves this module unadapted; expected the routed experts "
           "as target_parameters (--lora-target-parameters gate_up_proj,down_proj) and other modules by names PEFT "
           "keeps");
  }
  if (!expert_parts.empty() && !family_of(model_type).checkpoint_renames.empty())
    fail(lora.source, ": field \"target_modules\": adapts the routed experts of this ", model_type, " model per ",
         "expert (", expert_parts.begin()->first, "), modules only its remote code has, under names other than ",
         "the adapter's; expected the routed experts as target_parameters");
  // PEFT converts per-expert pairs to its fused layout as they are named without the expert index
  // ("…mlp.experts.gate_proj"), gate and up into one pair of rank 2 r and alpha 2 lora_alpha.
  for (const auto& [module, pair] : expert_parts) {
    const std::string experts = module.substr(0, module.rfind('.') + 1), part = module.substr(experts.size());
    if (pair.fused_by_peft && expert_parts.count(experts + pair.other) == 0)
      fail(lora.source, ": field \"target_modules\": adapts ", module, " of the routed experts without ", pair.other,
           "; PEFT fuses the per-expert gate and up pairs into one only with both; expected both or neither");
    if (!lora.targets_module(module))
      fail(lora.source, ": field \"target_modules\": adapts the routed experts' ", part, " of ", experts,
           " by their indices; PEFT (transformers 5) matches them as ", module, " and would leave them unadapted; "
           "expected a pattern that matches that name too");
    if (lora.rank_of(module) != pair.rank || lora.scaling_of(module) != pair.scaling)
      fail(lora.source, ": fields \"rank_pattern\" / \"alpha_pattern\": give the routed experts' ", part, " of ",
           experts, " rank ", pair.rank, " and scaling ", pair.scaling, " by their indices, but rank ",
           lora.rank_of(module), " and scaling ", lora.scaling_of(module), " as ", module,
           ", the name PEFT (transformers 5) reads them by; expected patterns that give both names alike");
    if (pair.fused_by_peft && (pair.rank != lora.r || lora.alpha_of(module) != lora.lora_alpha || lora.use_rslora))
      fail(lora.source, ": fields \"rank_pattern\" / \"alpha_pattern\" / \"use_rslora\": give the routed experts' ",
           part, " of ", experts, " rank ", pair.rank, ", alpha ", lora.alpha_of(module),
           "; PEFT fuses gate and up at rank 2 r and alpha 2 lora_alpha (scaling alpha / r); expected r ", lora.r,
           ", lora_alpha ", lora.lora_alpha, " and no rsLoRA there");
  }
}

std::string pair_module(const std::string& tensor) {
  return tensor.substr(0, tensor.size() - (tensor.ends_with(kPairA) ? kPairA : kPairB).size());
}

bool stored_as_is(const ParamTable& from, const ParamSpec& to) {
  if (!from.contains(to.name)) return false;
  const ParamSpec& source = from.find(to.name);
  if (source.shape != to.shape || source.adapter.has_value() != to.adapter.has_value()) return false;
  return !to.adapter || (source.adapter->scaling == to.adapter->scaling && source.adapter->row0 == to.adapter->row0);
}

template <class T>
void converted_tensor(const ParamTable& from, const T* params, const ParamTable& to_table, const ParamSpec& to, T* out,
                      std::set<std::string>& used) {
  if (!expert_pair(to))
    fail("--expert-layout: the converted adapter's ", to.name, " is not the trained one's; expected the same ",
         "modules adapted alike");
  // A pair on rows t0 .. t0 + rows of each expert's weight, from the source pairs on those rows: their
  // ranks side by side, A [E, rank, in] stacked, B [E, rows, rank] block-diagonal.
  const AdapterTarget& target = *to.adapter;
  const bool is_a = to.name.ends_with(kPairA);
  const int64_t E = to.shape[0], rank = to.shape[is_a ? 1 : 2], in = to.shape[2];
  const int64_t t0 = target.row0, rows = pair_rows(to_table, to);
  if (out != nullptr) std::fill(out, out + to.numel(), T(0));
  int64_t column = 0, covered = 0;
  for (const ParamSpec& s : from.entries()) {
    if (!expert_pair(s) || s.adapter->weight != target.weight || s.name.ends_with(kPairA) != is_a) continue;
    const int64_t s0 = s.adapter->row0, s_rows = pair_rows(from, s), s_rank = s.shape[is_a ? 1 : 2];
    const int64_t first = std::max(s0, t0), last = std::min(s0 + s_rows, t0 + rows);
    if (first >= last) continue;
    if (s.adapter->scaling != target.scaling || column + s_rank > rank)
      fail("--expert-layout: ", to.name, " (rank ", rank, ", scaling ", target.scaling, ") cannot hold ", s.name,
           " (rank ", s_rank, ", scaling ", s.adapter->scaling, "); expected the trained pairs' ranks and scaling");
    const T* source = params + s.offset;
    for (int64_t e = 0; e < E && out != nullptr; ++e) {
      if (is_a) {
        std::memcpy(static_cast<void*>(out + (e * rank + column) * in), source + e * s_rank * in,
                    s_rank * in * sizeof(T));
        continue;
      }
      for (int64_t row = first; row < last; ++row)
        std::memcpy(static_cast<void*>(out + (e * rows + row - t0) * rank + column),
                    source + (e * s_rows + row - s0) * s_rank, s_rank * sizeof(T));
    }
    column += s_rank;
    covered += last - first;
    used.insert(s.name);
  }
  if (column != rank || covered != rows)
    fail("--expert-layout: ", to.name, ": the trained pairs on rows ", t0, "..", t0 + rows, " of ", target.weight,
         " give rank ", column, " over ", covered, " rows; expected rank ", rank, " over ", rows);
}

template void converted_tensor<float>(const ParamTable&, const float*, const ParamTable&, const ParamSpec&, float*,
                                      std::set<std::string>&);
template void converted_tensor<double>(const ParamTable&, const double*, const ParamTable&, const ParamSpec&, double*,
                                       std::set<std::string>&);

}  // namespace trillion
