// How a layer kind declares its tensors once. A kind writes one function
//
//   template <class T, class Visit> void visit_params(KindWeights<T>& w, const KindDims& dims, Visit&& visit)
//
// that calls visit(w.field, ParamRow{...}) for each tensor, and visit(w.linear, linear_row(...)) for
// the weight of each linear layer (a LinearWeights). The same function builds the parameter table
// (declare_rows: the rows, prefixed with the layer's name and unit) and binds the pointers
// (bind_rows: field = base + offset of that row), so names are written in one place only. Binding
// happens once per model; the bound structs live as long as the flat buffers.
//
// A linear layer is where LoRA attaches (model/lora_config.h): when the run's adapter config
// targets the layer's module ("model.layers.3.self_attn.q_proj"), declare_rows adds its pair
// "MODULE.lora_A.weight" [r, in] (kaiming-uniform, ±1/√in) and "MODULE.lora_B.weight" [out, r]
// (zeros, so the adapted model starts as the base) to the lora group of the layer's unit, and
// bind_rows points the LinearWeights' pair at them with the module's rank and scaling.
//
// Routed experts' stacked weights (an ExpertWeights field, [E, out, in], whose row names the
// per-expert modules' parts) carry pairs the same way, one per expert inside each tensor
// (expert_pair_rows): PEFT's target_parameters on the whole weight ("…mlp.experts.gate_up_proj":
// rows "mlp.experts.gate_up_proj.lora_A.weight" [E, r, in] and ".lora_B.weight" [E, out, r], the
// fused layout), or target_modules on a part's per-expert modules ("…mlp.experts.3.gate_proj": rows
// "mlp.experts.gate_proj.lora_A.weight" [E, r, in] and ".lora_B.weight" [E, out / parts, r], stored
// per expert as "mlp.experts.3.gate_proj.lora_A.weight" [r, in], the per-expert layout).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/linear.h"
#include "model/lora_config.h"
#include "model/params.h"

namespace trillion {

// One tensor as a kind declares it; `name` and the key names are relative to the layer prefix.
struct ParamRow {
  std::string name;
  std::vector<int64_t> shape;
  InitKind init = InitKind::normal;
  double init_std = 0.0;
  double init_low = 0.0, init_high = 0.0;  // log_uniform's range
  bool weight_decay = true;
  ParamUse use = ParamUse::values;
  ParamGroup group = ParamGroup::dense;
  std::optional<AdapterTarget> adapter;  // a LoRA pair's tensor (lora_rows); weight relative to the prefix
  std::vector<HfKey> hf_keys;  // empty: stored under `name`
  std::vector<std::string> expert_parts;  // routed experts' [E, out, in]: its per-expert modules, out / parts rows each
};

// A normalization's convention, a property of each norm (Qwen3-Next's input norms are zero-centred,
// its gated linear-attention norm is not).
struct NormSpec {
  double eps = 1e-6;
  bool zero_centred = false;  // y = x̂ (1 + w), w initialized to 0; else y = x̂ w, w initialized to 1
};

// Initializer scales shared by every kind: inputs N(0, std_in²), outputs into the residual stream
// N(0, std_out²) with std_out = std_in / sqrt(2 · layers) (GPT-2 style depth scaling).
struct InitStds {
  double std_in = 0.02;
  double std_out = 0.02;
  static InitStds from(double initializer_range, int64_t num_layers) {
    return {initializer_range, initializer_range / std::sqrt(2.0 * double(num_layers))};
  }
};

// A row initialized by `init` (std for normal), with or without weight decay.
inline ParamRow make_row(std::string name, std::vector<int64_t> shape, InitKind init, double std, bool decay) {
  ParamRow row;
  row.name = std::move(name);
  row.shape = std::move(shape);
  row.init = init;
  row.init_std = std;
  row.weight_decay = decay;
  return row;
}
inline ParamRow norm_row(std::string name, int64_t dim, const NormSpec& norm) {
  return make_row(std::move(name), {dim}, norm.zero_centred ? InitKind::zeros : InitKind::ones, 0.0, false);
}
inline ParamRow weight_row(std::string name, std::vector<int64_t> shape, double std) {
  return make_row(std::move(name), std::move(shape), InitKind::normal, std, true);
}
// A linear layer's weight: a weight row that only products read.
inline ParamRow linear_row(std::string name, std::vector<int64_t> shape, double std) {
  ParamRow row = weight_row(std::move(name), std::move(shape), std);
  row.use = ParamUse::products;
  return row;
}
inline ParamRow bias_row(std::string name, int64_t dim) {
  return make_row(std::move(name), {dim}, InitKind::zeros, 0.0, false);
}

// Adds one row to the table under `prefix` (e.g. "model.layers.3.") in FSDP unit `unit`.
inline void add_row(ParamTable& table, const std::string& prefix, int unit, const ParamRow& row) {
  ParamSpec spec;
  spec.name = prefix + row.name;
  spec.shape = row.shape;
  spec.group = row.group;
  spec.unit = unit;
  spec.init = row.init;
  spec.init_std = row.init == InitKind::normal ? row.init_std : 0.0;
  spec.init_low = row.init_low;
  spec.init_high = row.init_high;
  spec.weight_decay = row.weight_decay;
  spec.use = row.use;
  spec.adapter = row.adapter;
  if (spec.adapter) spec.adapter->weight = prefix + spec.adapter->weight;
  for (const HfKey& key : row.hf_keys) spec.hf_keys.push_back({prefix + key.name, key.shape, key.offset});
  table.add(std::move(spec));
}

// The module a linear layer's weight row belongs to: its name without ".weight".
inline std::string linear_module(const std::string& prefix, const ParamRow& row) {
  constexpr std::string_view kSuffix = ".weight";
  TRILLION_CHECK(row.name.size() > kSuffix.size() && row.name.ends_with(kSuffix), "linear row ", row.name,
                 " does not end with .weight");
  return prefix + row.name.substr(0, row.name.size() - kSuffix.size());
}

// The pair of LoRA rows of a targeted linear layer (see above); `weight` is its [out, in] row.
inline std::pair<ParamRow, ParamRow> lora_rows(const ParamRow& weight, int64_t rank, double scaling) {
  const std::string module = weight.name.substr(0, weight.name.size() - std::string_view(".weight").size());
  const int64_t out = weight.shape.at(0), in = weight.shape.at(1);
  ParamRow a = make_row(module + ".lora_A.weight", {rank, in}, InitKind::uniform, 0.0, true);
  a.init_low = -1.0 / std::sqrt(double(in));
  a.init_high = 1.0 / std::sqrt(double(in));
  ParamRow b = make_row(module + ".lora_B.weight", {out, rank}, InitKind::zeros, 0.0, true);
  for (ParamRow* row : {&a, &b}) {
    row->use = ParamUse::products;
    row->group = ParamGroup::lora;
    row->adapter = AdapterTarget{weight.name, 0, scaling, false};
  }
  return {std::move(a), std::move(b)};
}

// One LoRA pair on routed experts' stacked weight (see above): rows row0 .. row0 + rows of every
// expert, the rank and scaling the config gives `module`, and its table rows.
struct ExpertPairRows {
  std::string module;  // full name: the weight ("…mlp.experts.gate_up_proj") or expert 0's module of the part
  int64_t row0 = 0, rows = 0, rank = 0;
  double scaling = 0.0;
  ParamRow a, b;
};

// The pairs `lora` (null: none) puts on the stacked expert weight `weight` under `prefix`: all of a
// layer's experts alike (a config matching some of them, or giving them different ranks, is refused).
inline std::vector<ExpertPairRows> expert_pair_rows(const LoraConfig* lora, const std::string& prefix,
                                                    const ParamRow& weight) {
  std::vector<ExpertPairRows> pairs;
  if (lora == nullptr) return pairs;
  const int64_t experts = weight.shape.at(0), out = weight.shape.at(1), in = weight.shape.at(2);
  const std::string container = weight.name.substr(0, weight.name.rfind('.'));  // "mlp.experts"
  const auto pair = [&](std::string module, std::string name, int64_t row0, int64_t rows, bool whole_parameter) {
    ExpertPairRows p{std::move(module), row0, rows, 0, 0.0, {}, {}};
    p.rank = lora->rank_of(p.module);
    p.scaling = lora->scaling_of(p.module);
    auto [a, b] = lora_rows(make_row(name + ".weight", {rows, in}, InitKind::zeros, 0.0, true), p.rank, p.scaling);
    a.shape.insert(a.shape.begin(), experts);  // [E, r, in]
    b.shape.insert(b.shape.begin(), experts);  // [E, rows, r]
    for (ParamRow* row : {&a, &b}) {
      row->adapter = AdapterTarget{weight.name, row0, p.scaling, whole_parameter, weight.expert_parts};
      row->group = ParamGroup::expert_lora;  // sliced over expert parallelism with the experts
    }
    p.a = std::move(a);
    p.b = std::move(b);
    return p;
  };
  const bool whole = lora->targets_parameter(prefix + weight.name);
  const int64_t parts = static_cast<int64_t>(weight.expert_parts.size());
  TRILLION_CHECK(parts > 0 && out % parts == 0, "expert weight ", weight.name, ": ", parts, " parts of ", out, " rows");
  const int64_t part_rows = out / parts;
  for (int64_t j = 0; j < parts; ++j) {
    const std::string& part = weight.expert_parts[j];
    const auto module_of = [&](int64_t e) { return prefix + container + "." + std::to_string(e) + "." + part; };
    int64_t matched = 0;
    for (int64_t e = 0; e < experts; ++e) matched += lora->targets_module(module_of(e));
    if (matched == 0) continue;
    if (whole)
      fail(lora->source, ": fields \"target_modules\" and \"target_parameters\": both adapt ", prefix + weight.name,
           "; expected one of them");
    if (matched < experts)
      fail(lora->source, ": field \"target_modules\": matches ", matched, " of the ", experts, " routed experts' ",
           part, " in ", prefix, "; expected all of a layer's experts or none");
    ExpertPairRows p = pair(module_of(0), container + "." + part, j * part_rows, part_rows, false);
    for (int64_t e = 1; e < experts; ++e)
      if (lora->rank_of(module_of(e)) != p.rank || lora->scaling_of(module_of(e)) != p.scaling)
        fail(lora->source, ": fields \"rank_pattern\" / \"alpha_pattern\": give ", module_of(e),
             " another rank or alpha than ", p.module, "; expected a layer's routed experts alike");
    for (int64_t e = 0; e < experts; ++e) {
      const std::string key = container + "." + std::to_string(e) + "." + part;
      p.a.hf_keys.push_back({key + ".lora_A.weight", {p.rank, in}, e * p.rank * in});
      p.b.hf_keys.push_back({key + ".lora_B.weight", {part_rows, p.rank}, e * part_rows * p.rank});
    }
    pairs.push_back(std::move(p));
  }
  if (whole) pairs.push_back(pair(prefix + weight.name, weight.name, 0, out, true));
  return pairs;
}

template <class Field>
constexpr bool kIsExpertWeights = false;
template <class T>
constexpr bool kIsExpertWeights<ExpertWeights<T>> = true;

// A row as a LoRA run declares it: a tensor of a module in `modules_to_save` trains whole, in the
// lora group (routed experts, whose rows shard over expert parallelism, cannot: refused).
inline ParamRow lora_saved_row(const LoraConfig* lora, const std::string& prefix, ParamRow row) {
  const std::string name = prefix + row.name;
  if (lora == nullptr || row.group == ParamGroup::buffer || !lora->saves_module(name.substr(0, name.rfind('.'))))
    return row;
  if (row.group == ParamGroup::expert)
    fail(lora->source, ": field \"modules_to_save\": matches ", name, ", a routed expert tensor; expected dense modules");
  row.group = ParamGroup::lora;
  return row;
}

// LoRA's changes to a table whose layers declared their adapters: the dense and expert groups
// frozen, after refusing what the engine does not adapt and a config that adapts nothing of the
// model `model_source`.
inline void freeze_base_for_lora(const LoraConfig& lora, ParamTable& table, const std::string& model_source) {
  if (lora.targets_module(kOutputLayer))
    fail(lora.source, ": field \"target_modules\": matches lm_head, whose adapter is not built; expected it in "
         "modules_to_save instead");
  bool modules = false, parameters = false;  // adapted through target_modules, through target_parameters
  for (const ParamSpec& spec : table.entries()) {
    if (!spec.adapter) continue;
    parameters = parameters || spec.adapter->whole_parameter;
    modules = modules || !spec.adapter->whole_parameter;
  }
  if (!lora.target_parameters.empty() && !parameters)
    fail(lora.source, ": field \"target_parameters\": matches no routed experts' weight of ", model_source,
         "; expected names such as mlp.experts.gate_up_proj, mlp.experts.down_proj");
  if ((!lora.target_modules.empty() || lora.target_parameters.empty()) && !modules)
    fail(lora.source, ": field \"target_modules\": matches no linear layer of ", model_source,
         "; expected Hugging Face module names such as q_proj, o_proj, down_proj");
  table.freeze(ParamGroup::dense);
  table.freeze(ParamGroup::expert);
}

// Builds the table rows of one kind. `Weights` is the kind's weights struct of any scalar type
// (only the rows are used); `lora` (null: none) adds the adapters it targets.
template <class Weights, class Dims>
void declare_rows(ParamTable& table, const std::string& prefix, int unit, const Dims& dims, const LoraConfig* lora) {
  Weights unbound;
  visit_params(unbound, dims, [&]<class Field>(Field&, const ParamRow& row) {
    add_row(table, prefix, unit, lora_saved_row(lora, prefix, row));
    if constexpr (kIsExpertWeights<Field>) {
      for (const ExpertPairRows& pair : expert_pair_rows(lora, prefix, row)) {
        add_row(table, prefix, unit, pair.a);
        add_row(table, prefix, unit, pair.b);
      }
    } else if constexpr (!std::is_pointer_v<Field>) {  // a linear layer
      const std::string module = linear_module(prefix, row);
      if (lora == nullptr || !lora->targets_module(module)) return;
      const auto [a, b] = lora_rows(row, lora->rank_of(module), lora->scaling_of(module));
      add_row(table, prefix, unit, a);
      add_row(table, prefix, unit, b);
    }
  });
}

// Points every field of `w` into `base` (parameters, or gradients: a frozen or buffer row of a
// gradient binding stays null, since it has no gradient), and each adapted linear layer's pair,
// with its rank and scaling from `lora`.
template <class T, class Weights, class Dims>
void bind_rows(Weights& w, const ParamTable& table, const std::string& prefix, T* base, bool gradients,
               const Dims& dims, const LoraConfig* lora) {
  const auto bind = [&](T*& field, const std::string& name) {
    const ParamSpec& spec = table.find(name);
    field = gradients && !spec.trainable() ? nullptr : base + spec.offset;
  };
  visit_params(w, dims, [&]<class Field>(Field& field, const ParamRow& row) {
    if constexpr (std::is_pointer_v<Field>) {
      bind(field, prefix + row.name);
    } else if constexpr (kIsExpertWeights<Field>) {
      bind(field.weight, prefix + row.name);
      field.lora.clear();
      for (const ExpertPairRows& pair : expert_pair_rows(lora, prefix, row)) {
        ExpertLoraPair<T> bound{nullptr, nullptr, pair.rank, pair.row0, pair.rows, pair.scaling};
        bind(bound.a, prefix + pair.a.name);
        bind(bound.b, prefix + pair.b.name);
        field.lora.push_back(bound);
      }
    } else {  // a linear layer
      bind(field.weight, prefix + row.name);
      const std::string module = linear_module(prefix, row);
      if (!table.contains(module + ".lora_A.weight")) return;
      bind(field.lora.a, module + ".lora_A.weight");
      bind(field.lora.b, module + ".lora_B.weight");
      field.lora.rank = table.find(module + ".lora_A.weight").shape[0];
      field.lora.scaling = lora->scaling_of(module);
      field.lora.dropout = lora->lora_dropout;
      field.lora.stream = hash_name(module);
    }
  });
}

}  // namespace trillion
