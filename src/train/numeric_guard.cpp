// The numeric guards' search for the first non-finite gradient (see numeric_guard.h).
#include "train/numeric_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/error.h"

namespace trillion {

OnNonFinite on_nonfinite_from_name(const std::string& name) {
  if (name == "stop") return OnNonFinite::stop;
  if (name == "skip") return OnNonFinite::skip;
  fail("--on-nonfinite ", name, ": expected stop or skip");
}

std::string NonFiniteGradient::describe() const {
  char value_text[32];
  std::snprintf(value_text, sizeof(value_text), "%g", value);
  return str_cat(parameter, "[", element, "] = ", value_text, " (", tensors, " of ", of_tensors,
                 " parameter tensors have non-finite gradients)");
}

template <class T>
NonFiniteGradient first_nonfinite_gradient(const ParamTable& table, const ShardLayout& layout, const T* shard,
                                           const ProcessGroup& world) {
  // Per tensor (table entries, in flat order) whether some rank holds a non-finite element of its
  // gradient (padding stays zero, so never counts).
  const std::vector<ParamSpec>& entries = table.entries();
  const auto entry_of = [&](int64_t flat) {  // the entry holding flat index `flat` (offsets increase)
    return std::upper_bound(entries.begin(), entries.end(), flat,
                            [](int64_t at, const ParamSpec& spec) { return at < spec.offset; }) - entries.begin() - 1;
  };
  std::vector<double> flagged(entries.size(), 0.0);  // [entries]
  for (const ShardLayout::Slice& slice : layout.slices())
    for (int64_t i = 0; i < slice.count; ++i)
      if (!std::isfinite(shard[slice.local + i])) flagged[entry_of(slice.global + i)] = 1.0;
  if (world.size() > 1) world.all_reduce_sum(flagged.data(), int64_t(flagged.size()));
  // The backward's first: the flagged tensor of the latest unit, the latest in it.
  int64_t chosen = -1;
  for (size_t e = 0; e < entries.size(); ++e) {
    if (flagged[e] == 0.0) continue;
    if (chosen < 0 || entries[e].unit > entries[chosen].unit ||
        (entries[e].unit == entries[chosen].unit && entries[e].offset > entries[chosen].offset))
      chosen = int64_t(e);
  }
  NonFiniteGradient result;
  if (chosen < 0) return result;
  // Its last non-finite element, on whichever rank holds it.
  const ParamSpec& spec = entries[chosen];
  double latest = -1.0, value = 0.0;
  for (const ShardLayout::Slice& slice : layout.slices()) {
    const int64_t begin = std::max(slice.global, spec.offset), end = std::min(slice.global + slice.count, spec.offset + spec.numel());
    for (int64_t g = begin; g < end; ++g) {
      const T x = shard[slice.local + (g - slice.global)];
      if (!std::isfinite(x)) latest = double(g - spec.offset), value = double(x);
    }
  }
  const std::vector<double> everyone = world.size() > 1 ? world.all_gather_values(std::vector<double>{latest, value})
                                                        : std::vector<double>{latest, value};
  for (size_t r = 0; r < everyone.size(); r += 2)
    if (everyone[r] > latest) latest = everyone[r], value = everyone[r + 1];
  result.parameter = spec.name;
  result.element = static_cast<int64_t>(latest);
  result.value = value;
  for (const ParamSpec& entry : entries) result.of_tensors += entry.trainable();
  for (double f : flagged) result.tensors += f > 0.0;
  return result;
}


NanInjection nan_injection_from_environment() {
  const char* text = std::getenv("TRILLION_TEST_NAN_AFTER_LAYER");
  NanInjection injection;
  if (text == nullptr) return injection;
  long long step = 0;
  int layer = 0, used = 0;
  if (std::sscanf(text, "%d@%lld%n", &layer, &step, &used) != 2 || text[used] != '\0' || layer < 0 || step < 1)
    fail("TRILLION_TEST_NAN_AFTER_LAYER: got \"", text, "\"; expected LAYER@STEP (layer >= 0, step >= 1)");
  injection.layer = layer;
  injection.step = step;
  return injection;
}

template <class T>
std::string NumericGuard::check(int64_t step, double loss, double grad_norm, const std::string& first_output,
                                const ParamTable& table, const ShardLayout& layout, const T* grads,
                                const ProcessGroup& world) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    in_a_row = 0;
    return std::string();
  }
  const NonFiniteGradient bad = first_nonfinite_gradient(table, layout, grads, world);
  const std::string what = str_cat(
      "step ", step, ": the loss is ", loss, " and the gradient norm ", grad_norm, "; ",
      bad.parameter.empty() ? std::string("every gradient is finite") : "the first non-finite gradient in backward order is " + bad.describe(),
      checking_outputs ? (first_output.empty() ? std::string("; every layer output is finite")
                                               : "; the first non-finite layer output: " + first_output)
                       : std::string("; --check-numerics names the first non-finite layer output"));
  if (mode == OnNonFinite::stop)
    fail(what, ". Nothing of this step was saved: the last checkpoint is intact (--on-nonfinite skip would drop "
         "the step and go on)");
  if (++in_a_row > max_skips)
    fail(what, ". ", in_a_row, " steps in a row were not finite, more than --max-nonfinite-skips ", max_skips);
  return what;
}

template std::string NumericGuard::check<float>(int64_t, double, double, const std::string&, const ParamTable&,
                                                const ShardLayout&, const float*, const ProcessGroup&);
template std::string NumericGuard::check<double>(int64_t, double, double, const std::string&, const ParamTable&,
                                                 const ShardLayout&, const double*, const ProcessGroup&);
template NonFiniteGradient first_nonfinite_gradient<float>(const ParamTable&, const ShardLayout&, const float*,
                                                           const ProcessGroup&);
template NonFiniteGradient first_nonfinite_gradient<double>(const ParamTable&, const ShardLayout&, const double*,
                                                            const ProcessGroup&);

}  // namespace trillion
