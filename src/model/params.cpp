// The parameter table (group-major, unit-major offsets with per-unit padding) and counter-based
// initialization.
#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "io/safetensors.h"

namespace trillion {

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::dense: return "dense";
    case ParamGroup::expert: return "expert";
    case ParamGroup::lora: return "lora";
    case ParamGroup::expert_lora: return "expert_lora";
    case ParamGroup::buffer: return "buffer";
  }
  return "?";
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// The element count of a shape, refused past kMaxParamElements (and before int64 overflows).
int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxParamElements)
      fail("parameter ", name, " of shape ", shape_string(shape), " has more than 2^50 elements: expected smaller sizes "
           "in the model config");
  return n;
}

}  // namespace

std::vector<HfKey> ParamSpec::checkpoint_keys() const {
  if (!hf_keys.empty()) return hf_keys;
  return {HfKey{name, shape, 0}};
}

void ParamTable::add(ParamSpec spec) {
  TRILLION_CHECK(index_.count(spec.name) == 0, "parameter ", spec.name, " added twice");
  TRILLION_CHECK(spec.unit >= 0, "parameter ", spec.name, " has negative unit ", spec.unit);
  for (int64_t d : spec.shape) TRILLION_CHECK(d > 0, "parameter ", spec.name, " has a non-positive dimension");
  checked_numel(spec.name, spec.shape);
  int64_t covered = 0;
  for (const HfKey& key : spec.hf_keys) {
    int64_t n = 1;
    for (int64_t d : key.shape) n *= d;
    TRILLION_CHECK(key.offset == covered, "parameter ", spec.name, ": key ", key.name, " starts at ", key.offset,
                   ", expected ", covered, " (keys must tile the tensor in order)");
    covered += n;
  }
  TRILLION_CHECK(spec.hf_keys.empty() || covered == spec.numel(), "parameter ", spec.name, ": its keys cover ",
                 covered, " of ", spec.numel(), " elements");
  index_.emplace(spec.name, entries_.size());
  entries_.push_back(std::move(spec));
}

void ParamTable::freeze(ParamGroup group) {
  TRILLION_CHECK(layout_groups_.empty(), "freeze(", param_group_name(group), ") after finalize");
  TRILLION_CHECK(group != ParamGroup::buffer, "buffers are never trained: nothing to freeze");
  frozen_[static_cast<int>(group)] = true;
}

std::vector<ParamGroup> ParamTable::groups_but_buffers(bool frozen) const {
  std::vector<ParamGroup> groups;
  for (ParamGroup group : layout_groups_)
    if (group != ParamGroup::buffer && frozen_[static_cast<int>(group)] == frozen) groups.push_back(group);
  return groups;
}

void ParamTable::finalize(int64_t pad_multiple) {
  TRILLION_CHECK(pad_multiple > 0, "pad_multiple must be positive");
  const auto round_up = [&](int64_t n) { return (n + pad_multiple - 1) / pad_multiple * pad_multiple; };
  // Layout order: trainable groups, then frozen ones, then the buffers, each set in enum order.
  const auto layout_rank = [&](ParamGroup group) {
    return group == ParamGroup::buffer ? 2 : frozen_[static_cast<int>(group)] ? 1 : 0;
  };
  layout_groups_.clear();
  for (int rank = 0; rank < 3; ++rank)
    for (int g = 0; g < kNumParamGroups; ++g)
      if (layout_rank(static_cast<ParamGroup>(g)) == rank) layout_groups_.push_back(static_cast<ParamGroup>(g));
  std::vector<int> position(kNumParamGroups);
  for (size_t i = 0; i < layout_groups_.size(); ++i) position[static_cast<int>(layout_groups_[i])] = int(i);
  std::stable_sort(entries_.begin(), entries_.end(), [&](const ParamSpec& a, const ParamSpec& b) {
    const int pa = position[static_cast<int>(a.group)], pb = position[static_cast<int>(b.group)];
    return pa != pb ? pa < pb : a.unit < b.unit;
  });
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  int num_units = 0;
  for (const ParamSpec& spec : entries_) num_units = std::max(num_units, spec.unit + 1);
  int64_t offset = 0;
  size_t next = 0;
  trainable_size_ = 0;
  sharded_size_ = 0;
  for (const ParamGroup group : layout_groups_) {
    const int g = static_cast<int>(group);
    units_[g].assign(num_units, UnitRange{});
    for (int unit = 0; unit < num_units; ++unit) {
      units_[g][unit].begin = offset;  // already a multiple of pad_multiple
      for (; next < entries_.size() && entries_[next].group == group && entries_[next].unit == unit; ++next) {
        entries_[next].offset = offset;
        entries_[next].frozen = frozen_[g];
        offset += entries_[next].numel();
        if (offset > kMaxParamElements)
          fail("the model has more than 2^50 parameter elements: expected smaller sizes in the model config");
      }
      offset = round_up(offset);
      units_[g][unit].end = offset;
    }
    if (layout_rank(group) == 0) trainable_size_ = offset;  // the trainable groups come first
    if (layout_rank(group) <= 1) sharded_size_ = offset;    // then the frozen ones
  }
  total_size_ = offset;
}

ParamTable ParamTable::with_checkpoint_renames(const std::vector<std::pair<std::string, std::string>>& renames) const {
  ParamTable renamed = *this;
  if (renames.empty()) return renamed;
  for (ParamSpec& spec : renamed.entries_) {
    std::vector<HfKey> keys = spec.checkpoint_keys();
    for (HfKey& key : keys)
      for (const auto& [from, to] : renames)
        for (size_t at = key.name.find(from); at != std::string::npos; at = key.name.find(from, at + to.size()))
          key.name.replace(at, from.size(), to);
    spec.hf_keys = std::move(keys);
  }
  return renamed;
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

int64_t ParamTable::num_elements(ParamGroup group) const {
  int64_t n = 0;
  for (const ParamSpec& spec : entries_)
    if (spec.group == group) n += spec.numel();
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
      case InitKind::inverse_softplus_log_uniform: {
        const CounterRng rng(seed, spec.name);
        const double low = std::log(spec.init_low), span = std::log(spec.init_high) - low;
        parallel_for(n, [&](int64_t i) {
          const double dt = std::max(std::exp(low + span * rng.uniform(i)), 1e-4);
          out[i] = static_cast<T>(dt + std::log(-std::expm1(-dt)));
        });
        break;
      }
      case InitKind::uniform: {
        const CounterRng rng(seed, spec.name);
        const double low = spec.init_low, span = spec.init_high - spec.init_low;
        parallel_for(n, [&](int64_t i) { out[i] = static_cast<T>(low + span * rng.uniform(i)); });
        break;
      }
      case InitKind::log_uniform: {
        const CounterRng rng(seed, spec.name);
        const double low = spec.init_low, span = spec.init_high - spec.init_low;
        parallel_for(n, [&](int64_t i) { out[i] = static_cast<T>(std::log(low + span * rng.uniform(i))); });
        break;
      }
    }
  }
}

template void init_parameters<float>(const ParamTable&, float*, uint64_t);
template void init_parameters<double>(const ParamTable&, double*, uint64_t);

}  // namespace trillion
