// The parameter table: one description of every tensor of a model (internal name, Hugging Face
// key(s), shape, group, FSDP unit, initializer, weight decay, trainable) that drives the flat
// buffers, initialization, checkpoint names, optimizer groups and sharding (parallel/shard_layout.h).
//
// Flat buffers are group-major, then unit-major inside a group: unit 0 holds the embeddings, unit
// 1 + l decoder layer l, unit 1 + L the final norm and the LM head (tied: unit 0 holds them;
// model.h's unit_order). The groups lie in layout order: the trainable ones (dense | expert | lora),
// then the frozen ones (LoRA's base: dense | expert), then the buffers, so gradients and optimizer
// moments cover [0, trainable_size()) and nothing else. Each (group, unit) range starts at a
// multiple of `pad_multiple` elements and is padded to one, so it can be sharded evenly on its own. A layer's experts are stacked [E, ...] with each expert's slice
// contiguous, so an expert-parallel rank's experts are one range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trillion {

// Layout order. lora: LoRA pairs and modules_to_save (model/param_rows.h); expert_lora: the routed
// experts' pairs, [E, …] tensors sliced over expert parallelism with their experts.
enum class ParamGroup { dense, expert, lora, expert_lora, buffer };
constexpr int kNumParamGroups = 5;
const char* param_group_name(ParamGroup group);

enum class InitKind {
  normal,  // N(0, init_std²)
  zeros,
  ones,
  log_uniform,  // log(U(init_low, init_high)): Gated DeltaNet's and KDA's A_log
  inverse_softplus_log_uniform,  // softplus⁻¹(max(exp(U(log init_low, log init_high)), 1e-4)): KDA's dt_bias
  uniform,  // U(init_low, init_high): LoRA's A (kaiming-uniform with a = √5: ±1/√in)
};

// How the model reads a tensor: as values (embeddings looked up, norms, biases, the router, whose
// products read float, convolutions, gates), only as an operand of float products (a linear
// layer's weight), or both (tied embeddings: looked up, and the LM head's weight). Under the bf16
// precision a product reads its operands' bf16 rounding, so FSDP gathers a products-only tensor in
// bf16 alone (parallel/fsdp.h).
enum class ParamUse { values, products, values_and_products };

// One tensor as a Hugging Face checkpoint stores it: `numel(shape)` contiguous elements of the
// parameter starting at element `offset`. A stacked expert tensor has one key per expert (and per
// part: gate_proj and up_proj of a fused gate_up); every other tensor one key for all of it.
struct HfKey {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // element offset inside the parameter
};

// What a LoRA pair's tensor adapts (model/param_rows.h): a weight, for routed experts' pairs from
// row `row0` of each expert's [out, in], with the pair's scaling; `whole_parameter`: PEFT's
// target_parameters on routed experts' stacked weight, stored as its ParamWrapper stores them
// (model/adapter_weights.cpp).
struct AdapterTarget {
  std::string weight;  // the adapted tensor's name ("…self_attn.q_proj.weight", "…mlp.experts.gate_up_proj")
  int64_t row0 = 0;
  double scaling = 0.0;
  bool whole_parameter = false;
  std::vector<std::string> parts = {};  // routed experts' weight: its per-expert modules ("gate_proj", "up_proj")
};

struct ParamSpec {
  std::string name;  // internal name = the name transformers uses in memory (state_dict)
  std::vector<int64_t> shape;
  ParamGroup group = ParamGroup::dense;
  int unit = 0;
  InitKind init = InitKind::normal;
  double init_std = 0.02;
  double init_low = 0.0, init_high = 0.0;  // log_uniform's range
  bool weight_decay = true;
  ParamUse use = ParamUse::values;
  std::vector<HfKey> hf_keys = {};  // empty: stored under `name` with `shape`
  int64_t offset = 0;          // element offset in the flat buffer; set by ParamTable::finalize
  bool frozen = false;         // its group is frozen (ParamTable::freeze); set by ParamTable::finalize
  // set: a LoRA pair's tensor, stored in the adapter's files, not the model's
  std::optional<AdapterTarget> adapter = std::nullopt;
  int64_t numel() const;
  bool trainable() const { return group != ParamGroup::buffer && !frozen; }
  // The keys a checkpoint of the original (save_pretrained default) layout stores.
  std::vector<HfKey> checkpoint_keys() const;
};

// The most elements a tensor or a whole table may have (2^50, a petabyte of float32 parameters):
// larger configs are refused with the tensor named, long before byte counts could overflow.
constexpr int64_t kMaxParamElements = int64_t(1) << 50;

class ParamTable {
 public:
  void add(ParamSpec spec);  // names must be unique; order inside a (group, unit) is kept
  // Makes a group's tensors frozen: no gradient, no optimizer state (LoRA's base). Before finalize.
  void freeze(ParamGroup group);
  void finalize(int64_t pad_multiple = 64);
  // The groups in layout order (trainable, frozen, buffer), the trainable ones among them, and the
  // frozen ones.
  const std::vector<ParamGroup>& layout_groups() const { return layout_groups_; }
  std::vector<ParamGroup> trainable_groups() const { return groups_but_buffers(false); }
  std::vector<ParamGroup> frozen_groups() const { return groups_but_buffers(true); }
  const std::vector<ParamSpec>& entries() const { return entries_; }  // in layout order once finalized
  const ParamSpec& find(const std::string& name) const;  // CHECK-fails if absent
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  int64_t total_size() const { return total_size_; }  // elements, padding included
  int64_t trainable_size() const { return trainable_size_; }  // elements of the trainable groups
  // Elements of the trainable and the frozen groups, [0, sharded_size()): what FSDP shards (the
  // buffers follow; every rank keeps them whole).
  int64_t sharded_size() const { return sharded_size_; }
  int64_t num_elements() const;                        // elements, padding excluded
  int64_t num_elements(ParamGroup group) const;
  struct UnitRange {
    int64_t begin = 0;
    int64_t end = 0;
  };
  // The same table with every checkpoint key renamed by the substring replacements, in order
  // (a family's save_pretrained names, model/family.h); internal names stay.
  ParamTable with_checkpoint_renames(const std::vector<std::pair<std::string, std::string>>& renames) const;
  // Per group, the element range of each unit (empty ranges for units the group lacks).
  const std::vector<UnitRange>& units(ParamGroup group) const { return units_[static_cast<int>(group)]; }

 private:
  std::vector<ParamGroup> groups_but_buffers(bool frozen) const;  // in layout order
  std::vector<ParamSpec> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<UnitRange> units_[kNumParamGroups];
  bool frozen_[kNumParamGroups] = {};
  std::vector<ParamGroup> layout_groups_;
  int64_t total_size_ = 0;
  int64_t trainable_size_ = 0;
  int64_t sharded_size_ = 0;
};

// Fills every parameter from the counter-based RNG: element i of tensor `name` depends only on
// (seed, name, i). Padding stays zero.
template <class T>
void init_parameters(const ParamTable& table, T* values, uint64_t seed);

}  // namespace trillion
