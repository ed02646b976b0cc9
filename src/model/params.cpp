// The parameter table (unit-major offsets with per-unit padding) and counter-based initialization.
#include "model/params.h"

#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace trillion {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void ParamTable::add(ParamSpec spec) {
  TRILLION_CHECK(index_.count(spec.name) == 0, "parameter ", spec.name, " added twice");
  TRILLION_CHECK(spec.unit >= 0, "parameter ", spec.name, " has negative unit ", spec.unit);
  TRILLION_CHECK(entries_.empty() || spec.unit >= entries_.back().unit, "parameter ", spec.name, " (unit ",
                 spec.unit, ") added after unit ", entries_.back().unit, ": add in unit order");
  for (int64_t d : spec.shape) TRILLION_CHECK(d > 0, "parameter ", spec.name, " has a non-positive dimension");
  index_.emplace(spec.name, entries_.size());
  entries_.push_back(std::move(spec));
}

void ParamTable::finalize(int64_t pad_multiple) {
  TRILLION_CHECK(pad_multiple > 0, "pad_multiple must be positive");
  const auto round_up = [&](int64_t n) { return (n + pad_multiple - 1) / pad_multiple * pad_multiple; };
  const int num_units = entries_.empty() ? 0 : entries_.back().unit + 1;
  units_.assign(num_units, UnitRange{});
  int64_t offset = 0;
  size_t next = 0;
  for (int unit = 0; unit < num_units; ++unit) {
    units_[unit].begin = offset;  // already a multiple of pad_multiple
    for (; next < entries_.size() && entries_[next].unit == unit; ++next) {
      entries_[next].offset = offset;
      offset += entries_[next].numel();
    }
    offset = round_up(offset);
    units_[unit].end = offset;
  }
  total_size_ = offset;
}

const ParamSpec& ParamTable::find(const std::string& name) const {
  const auto it = index_.find(name);
  TRILLION_CHECK(it != index_.end(), "no parameter named ", name);
  return entries_[it->second];
}

int64_t ParamTable::num_elements() const {
  int64_t n = 0;
  for (const ParamSpec& spec : entries_) n += spec.numel();
  return n;
}

template <class T>
void init_parameters(const ParamTable& table, T* values, uint64_t seed) {
  std::memset(static_cast<void*>(values), 0, table.total_size() * sizeof(T));  // padding stays zero
  for (const ParamSpec& spec : table.entries()) {
    T* out = values + spec.offset;
    const int64_t n = spec.numel();
    switch (spec.init) {
      case InitKind::zeros:
        break;
      case InitKind::ones:
        for (int64_t i = 0; i < n; ++i) out[i] = T(1);
        break;
      case InitKind::normal: {
        const CounterRng rng(seed, spec.name);
        const double std = spec.init_std;
        parallel_for(n, [&](int64_t i) { out[i] = static_cast<T>(rng.normal(static_cast<uint64_t>(i)) * std); });
        break;
      }
    }
  }
}

template void init_parameters<float>(const ParamTable&, float*, uint64_t);
template void init_parameters<double>(const ParamTable&, double*, uint64_t);

}  // namespace trillion
