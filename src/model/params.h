// The parameter table: one description of every tensor of a model (name, shape, group, FSDP unit,
// initializer, weight decay) that drives the flat buffers, initialization, checkpoint names,
// optimizer groups and, later, sharding.
//
// Flat buffers are unit-major: unit 0 holds embeddings, final norm and LM head; unit 1 + l holds
// decoder layer l. Each unit starts at a multiple of `pad_multiple` elements and is padded to one,
// so a unit can be sharded evenly on its own. Expert tensors are stacked [E, ...] (later issues).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace trillion {

enum class ParamGroup { dense, expert, lora, buffer };

enum class InitKind {
  normal,  // N(0, init_std²)
  zeros,
  ones,
};

struct ParamSpec {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  ParamGroup group = ParamGroup::dense;
  int unit = 0;
  InitKind init = InitKind::normal;
  double init_std = 0.02;
  bool weight_decay = true;
  int64_t offset = 0;  // element offset in the flat buffer; set by ParamTable::finalize
  int64_t numel() const;
};

class ParamTable {
 public:
  void add(ParamSpec spec);  // in unit order; names must be unique
  void finalize(int64_t pad_multiple = 64);
  const std::vector<ParamSpec>& entries() const { return entries_; }
  const ParamSpec& find(const std::string& name) const;  // CHECK-fails if absent
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  int64_t total_size() const { return total_size_; }  // elements, padding included
  int64_t num_elements() const;                        // elements, padding excluded
  struct UnitRange {
    int64_t begin = 0;
    int64_t end = 0;
  };
  const std::vector<UnitRange>& units() const { return units_; }

 private:
  std::vector<ParamSpec> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<UnitRange> units_;
  int64_t total_size_ = 0;
};

// Fills every parameter from the counter-based RNG: element i of tensor `name` depends only on
// (seed, name, i). Padding stays zero.
template <class T>
void init_parameters(const ParamTable& table, T* values, uint64_t seed);

}  // namespace trillion
