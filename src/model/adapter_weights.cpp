// A LoRA model's adapter in PEFT's files (PeftModel.save_pretrained / from_pretrained):
// adapter_config.json, and adapter_model.safetensors holding every trainable tensor of the run
// (each lora_A / lora_B pair and each module of modules_to_save) under "base_model.model." + its
// name, in the model's float type (PEFT saves the adapter's dtype). Routed experts' pairs
// (model/param_rows.h) are stored as PEFT stores them:
//
//   per-expert layout   one pair per expert module, "…mlp.experts.3.gate_proj.lora_A.weight" [r, in]
//                       (the tensor's hf_keys), as PEFT writes for transformers 4's expert lists
//   fused layout        PEFT's ParamWrapper on the stacked weight (target_parameters): lora_A
//                       [E · r, in], rows expert-major (the tensor itself), lora_B [out, r · E],
//                       columns rank-major with the expert fastest (column k · E + e holds
//                       B[e][:, k]). A module's targeted parameters nest in declaration order, the
//                       first innermost: with gate_up_proj and down_proj both adapted, gate_up_proj's
//                       pair is "…mlp.experts.base_layer.lora_A.weight" and down_proj's
//                       "…mlp.experts.lora_A.weight".
//
// Loading is all-or-nothing, as load_weights: every tensor is checked (missing, misshaped, extra)
// and read into a staging buffer before the parameters change. merge_adapter_into folds the pairs
// into the weights.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model_impl.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

constexpr const char* kAdapterPrefix = "base_model.model.";  // PeftModel's prefix, adapter name removed
constexpr const char* kAdapterFile = "adapter_model.safetensors";
constexpr std::string_view kPairA = ".lora_A.weight", kPairB = ".lora_B.weight";

// One tensor of the adapter file: `shape` elements from `offset` of the spec's values, or, for a
// fused layout's lora_B, all of them in PEFT's rank-major column order.
struct FileTensor {
  std::string key;
  std::vector<int64_t> shape;
  const ParamSpec* spec;
  int64_t offset = 0;
  bool rank_major = false;
};

// The stacked weights of each experts module ("…mlp.experts") that carry a fused-layout pair, in
// declaration order (PEFT's nesting order).
std::map<std::string, std::vector<std::string>> wrapped_parameters(const ParamTable& table) {
  std::map<std::string, std::vector<std::string>> wrapped;
  for (const ParamSpec& spec : table.entries())
    if (spec.adapter && spec.adapter->whole_parameter && spec.name.ends_with(kPairA)) {
      const std::string& weight = spec.adapter->weight;
      wrapped[weight.substr(0, weight.rfind('.'))].push_back(weight);
    }
  return wrapped;
}

// The file's tensors, from the trainable tensors of `table`.
std::vector<FileTensor> file_tensors(const ParamTable& table) {
  const std::map<std::string, std::vector<std::string>> wrapped = wrapped_parameters(table);
  std::vector<FileTensor> tensors;
  for (const ParamSpec& spec : table.entries()) {
    if (!spec.trainable()) continue;
    if (!spec.adapter || spec.shape.size() == 2) {
      tensors.push_back({kAdapterPrefix + spec.name, spec.shape, &spec});
    } else if (!spec.adapter->whole_parameter) {  // per-expert layout
      for (const HfKey& key : spec.hf_keys) tensors.push_back({kAdapterPrefix + key.name, key.shape, &spec, key.offset});
    } else {  // fused layout: [E, r, in] → [E · r, in]; [E, out, r] → [out, r · E]
      const std::string& weight = spec.adapter->weight;
      const std::string module = weight.substr(0, weight.rfind('.'));
      const std::vector<std::string>& nested = wrapped.at(module);
      const auto outer = nested.end() - std::find(nested.begin(), nested.end(), weight) - 1;  // wrappers around it
      std::string key = kAdapterPrefix + module;
      for (int64_t i = 0; i < outer; ++i) key += ".base_layer";
      const bool is_a = spec.name.ends_with(kPairA);
      const int64_t E = spec.shape[0];
      key += is_a ? kPairA : kPairB;
      if (is_a)
        tensors.push_back({key, {E * spec.shape[1], spec.shape[2]}, &spec});
      else
        tensors.push_back({key, {spec.shape[1], spec.shape[2] * E}, &spec, 0, true});
    }
  }
  return tensors;
}

// The index in PEFT's rank-major lora_B [rows, r · E] of b[e, o, k], for b [E, rows, r] (`shape`).
int64_t rank_major_index(const std::vector<int64_t>& shape, int64_t e, int64_t o, int64_t k) {
  return o * shape[2] * shape[0] + k * shape[0] + e;
}

// file [rows, r · E] = b [E, rows, r] in PEFT's order, or b = file (from_file).
template <class T>
void reorder_rank_major(const T* from, T* to, const std::vector<int64_t>& shape, bool from_file) {
  const int64_t E = shape[0], rows = shape[1], r = shape[2];
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t k = 0; k < r; ++k) {
        const int64_t mine = (e * rows + o) * r + k, theirs = rank_major_index(shape, e, o, k);
        to[from_file ? mine : theirs] = from[from_file ? theirs : mine];
      }
}

// The adapter of `config` (whose table is `trained`) as written in `layout`: the config it is written
// with (none: as trained) and its table, checked without values: each trainable tensor is stored as
// is or converted from trained pairs, every trained tensor is written, and PEFT reads it alike; what
// fails is refused naming the tensor or field.
struct WrittenAdapter {
  std::optional<LoraConfig> config;
  ParamTable table;
};

WrittenAdapter written_adapter(const ModelConfig& config, const ParamTable& trained, ExpertLayout layout) {
  WrittenAdapter written{lora_in_layout(*config.lora, trained, layout), trained};
  if (!written.config) return written;
  written.config->source = config.lora->source + " rewritten for --expert-layout " +
                           expert_layout_names()[static_cast<int>(layout)];
  ModelConfig with_written = config;
  with_written.lora = std::make_shared<const LoraConfig>(*written.config);
  written.table = param_table_of(with_written);
  std::set<std::string> used;  // the trained tensors written
  for (const ParamSpec& spec : written.table.entries()) {
    if (!spec.trainable()) continue;
    if (stored_as_is(trained, spec))
      used.insert(spec.name);
    else
      converted_tensor<float>(trained, nullptr, written.table, spec, nullptr, used);
  }
  for (const ParamSpec& spec : trained.entries())
    if (spec.trainable() && used.count(spec.name) == 0)
      fail("--expert-layout ", expert_layout_names()[static_cast<int>(layout)], ": the adapter in that layout (",
           config.lora->source, " rewritten) would not hold ", spec.name, "; expected a config whose names adapt ",
           "the same modules");
  check_peft_reads_it_alike(*written.config, written.table, config.model_type);
  return written;
}

}  // namespace

void check_adapter_layout(const ModelConfig& config, ExpertLayout layout) {
  written_adapter(config, param_table_of(config), layout);
}

int64_t adapter_file_staging_bytes(const ModelConfig& config, ExpertLayout layout, int64_t element_bytes) {
  const ParamTable trained = param_table_of(config);
  const ParamTable table = written_adapter(config, trained, layout).table;
  int64_t bytes = 0;
  for (const ParamSpec& spec : table.entries())
    if (spec.trainable() && !stored_as_is(trained, spec)) bytes += spec.numel() * element_bytes;
  for (const FileTensor& tensor : file_tensors(table))
    if (tensor.rank_major) bytes += tensor.spec->numel() * element_bytes;
  return bytes;
}

template <class T>
void Model<T>::save_adapter(const std::string& directory, ExpertLayout layout) const {
  const Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr, "save_adapter of a model without LoRA");
  const WrittenAdapter adapter = written_adapter(m.config, m.table, layout);
  const ParamTable& written = adapter.table;
  std::filesystem::create_directories(directory);
  SafetensorsWriter writer;
  std::vector<Buffer<T>> held;                 // converted pairs and rank-major copies, alive until written
  std::map<std::string, const T*> values_of;  // each written tensor's values
  std::set<std::string> used;                  // the trained tensors written (checked by written_adapter)
  for (const ParamSpec& spec : written.entries()) {
    if (!spec.trainable()) continue;
    if (stored_as_is(m.table, spec)) {
      values_of[spec.name] = m.params.data() + m.table.find(spec.name).offset;
      continue;
    }
    held.emplace_back(spec.numel());
    converted_tensor(m.table, m.params.data(), written, spec, held.back().data(), used);
    values_of[spec.name] = held.back().data();
  }
  for (const FileTensor& tensor : file_tensors(written)) {
    const T* values = values_of.at(tensor.spec->name) + tensor.offset;
    if (tensor.rank_major) {
      held.emplace_back(tensor.spec->numel());
      reorder_rank_major(values, held.back().data(), tensor.spec->shape, /*from_file=*/false);
      values = held.back().data();
    }
    writer.add(tensor.key, dtype_of<T>(), tensor.shape, values);
  }
  writer.write((std::filesystem::path(directory) / kAdapterFile).string());
  adapter.config.value_or(*m.config.lora).save((std::filesystem::path(directory) / "adapter_config.json").string());
}

template <class T>
void Model<T>::load_adapter(const std::string& directory) {
  Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr, "load_adapter of a model without LoRA");
  const SafetensorsReader reader((std::filesystem::path(directory) / kAdapterFile).string());
  const std::vector<FileTensor> tensors = file_tensors(m.table);
  std::set<std::string> expected;
  for (const FileTensor& tensor : tensors) {
    expected.insert(tensor.key);
    if (!reader.contains(tensor.key))
      fail(reader.path(), ": tensor ", tensor.key, " is missing (expected shape ", shape_string(tensor.shape),
           ", from ", m.config.lora->source, ")");
    if (reader.info(tensor.key).shape != tensor.shape)
      fail(reader.path(), ": tensor ", tensor.key, " has shape ", shape_string(reader.info(tensor.key).shape),
           ", expected ", shape_string(tensor.shape), " (", m.config.lora->source, " on ", m.config.source, ")");
  }
  for (const auto& [key, info] : reader.tensors())
    if (expected.count(key) == 0)
      fail(reader.path(), ": tensor ", key, " is not a trainable tensor of this adapter on ", m.config.source,
           " (", m.config.lora->source, ")");
  Buffer<T> staging(m.table.trainable_size());  // [trainable_size]: the trainable groups come first
  std::memcpy(static_cast<void*>(staging.data()), m.params.data(), m.table.trainable_size() * sizeof(T));
  for (const FileTensor& tensor : tensors) {
    T* values = staging.data() + tensor.spec->offset + tensor.offset;
    if (!tensor.rank_major) {
      reader.read(tensor.key, tensor.shape, values);
      continue;
    }
    Buffer<T> file(tensor.spec->numel());  // [rows, r · E]
    reader.read(tensor.key, tensor.shape, file.data());
    reorder_rank_major(file.data(), values, tensor.spec->shape, /*from_file=*/true);
  }
  std::memcpy(static_cast<void*>(m.params.data()), staging.data(), m.table.trainable_size() * sizeof(T));
}

template <class T>
void Model<T>::merge_adapter_into(Model<T>& plain) const {
  const Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr && plain.config().lora == nullptr, "merge_adapter_into: from a LoRA model ",
                 "into one without");
  for (const ParamSpec& target : plain.table().entries()) {
    const ParamSpec& source = m.table.find(target.name);
    TRILLION_CHECK(source.shape == target.shape, "merge_adapter_into: ", target.name, " differs in shape");
    std::memcpy(plain.params() + target.offset, m.params.data() + source.offset, target.numel() * sizeof(T));
  }
  for (const ParamSpec& a : m.table.entries()) {
    if (!a.adapter || !a.name.ends_with(kPairA)) continue;
    const ParamSpec& b = m.table.find(pair_module(a.name) + std::string(kPairB));
    const ParamSpec& weight = plain.table().find(a.adapter->weight);
    // A [E, rank, in], B [E, rows, rank], weight [E, weight_rows, in]; E = 1 unless routed experts'.
    const bool experts = a.shape.size() == 3;
    const int64_t E = experts ? a.shape[0] : 1, rank = a.shape[experts], in = a.shape[experts + 1];
    const int64_t rows = b.shape[experts], weight_rows = weight.shape[experts];
    for (int64_t e = 0; e < E; ++e)  // weight[e][row0 + o, i] += scaling · B[e] · A[e]
      gemm<T>(false, false, rows, in, rank, T(a.adapter->scaling), m.params.data() + b.offset + e * rows * rank, rank,
              m.params.data() + a.offset + e * rank * in, in, T(1),
              plain.params() + weight.offset + (e * weight_rows + a.adapter->row0) * in, in, Operands::fp32);
  }
}

template void Model<float>::save_adapter(const std::string&, ExpertLayout) const;
template void Model<float>::load_adapter(const std::string&);
template void Model<double>::save_adapter(const std::string&, ExpertLayout) const;
template void Model<double>::load_adapter(const std::string&);
template void Model<float>::merge_adapter_into(Model<float>&) const;
template void Model<double>::merge_adapter_into(Model<double>&) const;

}  // namespace trillion
