// How a layer kind declares its tensors once. A kind writes one function
//
//   template <class T, class Visit> void visit_params(KindWeights<T>& w, const KindDims& dims, Visit&& visit)
//
// that calls visit(w.field, ParamRow{...}) for each tensor. The same function builds the parameter
// table (declare_rows: the rows, prefixed with the layer's name and unit) and binds the pointers
// (bind_rows: field = base + offset of that row), so names are written in one place only. Binding
// happens once per model; the bound structs live as long as the flat buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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
  std::vector<HfKey> hf_keys;  // empty: stored under `name`
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
  for (const HfKey& key : row.hf_keys) spec.hf_keys.push_back({prefix + key.name, key.shape, key.offset});
  table.add(std::move(spec));
}

// Builds the table rows of one kind. `Weights` is the kind's weights struct of any scalar type
// (only the rows are used).
template <class Weights, class Dims>
void declare_rows(ParamTable& table, const std::string& prefix, int unit, const Dims& dims) {
  Weights unbound;
  visit_params(unbound, dims, [&](auto*&, const ParamRow& row) { add_row(table, prefix, unit, row); });
}

// Points every field of `w` into `base` (parameters, or gradients: a buffer row of a gradient
// binding stays null, since buffers have no gradient).
template <class T, class Weights, class Dims>
void bind_rows(Weights& w, const ParamTable& table, const std::string& prefix, T* base, bool gradients,
               const Dims& dims) {
  visit_params(w, dims, [&](T*& field, const ParamRow& row) {
    const ParamSpec& spec = table.find(prefix + row.name);
    field = gradients && !spec.trainable() ? nullptr : base + spec.offset;
  });
}

}  // namespace trillion
