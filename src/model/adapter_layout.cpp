// Routed experts' adapters converted between PEFT's layouts (see adapter_layout.h).
#include "model/adapter_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string_view>

#include "core/error.h"

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

// `name` as a regular expression matching itself: every character but letters, digits and '_' escaped.
std::string escaped(const std::string& name) {
  std::string pattern;
  for (const char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') pattern += '\\';
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
  std::vector<const ParamSpec*> pairs;  // the A tensors of the routed experts' pairs that change layout
  std::vector<std::string> containers, parts;  // their experts modules, any layer ("model\.layers\.\d+\.mlp\.experts"); parts
  for (const ParamSpec& spec : table.entries()) {
    if (!expert_pair(spec) || !spec.name.ends_with(kPairA) || spec.adapter->whole_parameter != to_per_expert) continue;
    pairs.push_back(&spec);
    add_once(containers, any_layer(spec.adapter->weight.substr(0, spec.adapter->weight.rfind('.'))));
    for (const std::string& part : spec.adapter->parts) add_once(parts, part);
  }
  if (pairs.empty()) return std::nullopt;
  const std::string layout_flag = "--expert-layout " + expert_layout_names()[static_cast<int>(layout)];
  if (lora.target_modules.all_linear())
    fail(lora.source, ": field \"target_modules\": all-linear, which ", layout_flag, " cannot rewrite; expected names");
  // The per-expert modules, of any expert and by the name without the index PEFT (transformers 5) reads.
  const std::string experts = "(?:" + join(containers, "|") + ")\\.(?:\\d+\\.)?(?:" + join(parts, "|") + ")";
  LoraConfig out = lora;
  ModuleNames& targets = out.target_modules;
  if (to_per_expert) {
    targets.pattern = targets.empty() ? experts : "(?:" + as_pattern(targets) + ")|" + experts;
    targets.names.clear();
    std::erase_if(out.target_parameters, [&](const std::string& entry) {
      return std::any_of(pairs.begin(), pairs.end(), [&](const ParamSpec* a) { return names_module(entry, a->adapter->weight); });
    });
  } else if (targets.pattern) {
    targets.pattern = "(?!" + experts + "$)(?:" + *targets.pattern + ")";
  } else {  // PEFT's own rewrite: the names that match per-expert modules become target_parameters
    std::erase_if(targets.names, [&](const std::string& entry) {
      return std::any_of(pairs.begin(), pairs.end(), [&](const ParamSpec* a) { return names_module(entry, pair_module(a->name)); });
    });
  }
  // Each written pair keeps its rank and scaling: a pattern pins them where the config would give
  // others (PEFT's ".*\.gate_up_proj": 2 r, alpha 2 lora_alpha for gate and up fused).
  const auto pin = [&](const std::string& key, const std::string& name, int64_t rank, double scaling) {
    if (out.rank_of(name) == rank && out.scaling_of(name) == scaling) return;
    std::erase_if(out.rank_pattern, [&](const auto& entry) { return entry.first == key; });
    std::erase_if(out.alpha_pattern, [&](const auto& entry) { return entry.first == key; });
    out.rank_pattern.insert(out.rank_pattern.begin(), {key, rank});
    const double alpha = scaling * (out.use_rslora ? std::sqrt(double(rank)) : double(rank));
    out.alpha_pattern.insert(out.alpha_pattern.begin(), {key, alpha});
  };
  for (const ParamSpec* a : pairs) {
    const std::string& weight = a->adapter->weight;
    const std::string container = weight.substr(0, weight.rfind('.'));
    if (to_per_expert) {
      for (const std::string& part : a->adapter->parts)
        pin(any_layer(container) + "\\.(?:\\d+\\.)?" + part, container + ".0." + part, a->shape[1], a->adapter->scaling);
      continue;
    }
    add_once(out.target_parameters, leaf(weight));
    int64_t rank = 0;  // the parts' ranks side by side
    for (const ParamSpec* other : pairs) rank += other->adapter->weight == weight ? other->shape[1] : 0;
    pin(".*\\." + leaf(weight), weight, rank, a->adapter->scaling);
  }
  return out;
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
  std::fill(out, out + to.numel(), T(0));
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
    for (int64_t e = 0; e < E; ++e) {
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
