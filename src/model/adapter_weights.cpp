// A LoRA model's adapter in PEFT's files (PeftModel.save_pretrained / from_pretrained):
// adapter_config.json, and adapter_model.safetensors holding every trainable tensor of the run
// (each lora_A / lora_B pair and each module of modules_to_save) under "base_model.model." + its
// in-memory name, in the model's float type (PEFT saves the adapter's dtype). Loading is
// all-or-nothing, as load_weights: every tensor is checked (missing, misshaped, extra) and read into
// a staging buffer before the parameters change. merge_adapter_into folds the pairs into the weights.
#include <cstring>
#include <filesystem>
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

std::string adapter_key(const ParamSpec& spec) { return kAdapterPrefix + spec.name; }

}  // namespace

template <class T>
void Model<T>::save_adapter(const std::string& directory) const {
  const Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr, "save_adapter of a model without LoRA");
  std::filesystem::create_directories(directory);
  SafetensorsWriter writer;
  for (const ParamSpec& spec : m.table.entries())
    if (spec.trainable()) writer.add(adapter_key(spec), dtype_of<T>(), spec.shape, m.params.data() + spec.offset);
  writer.write((std::filesystem::path(directory) / kAdapterFile).string());
  m.config.lora->save((std::filesystem::path(directory) / "adapter_config.json").string());
}

template <class T>
void Model<T>::load_adapter(const std::string& directory) {
  Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr, "load_adapter of a model without LoRA");
  const SafetensorsReader reader((std::filesystem::path(directory) / kAdapterFile).string());
  std::set<std::string> expected;
  for (const ParamSpec& spec : m.table.entries()) {
    if (!spec.trainable()) continue;
    const std::string key = adapter_key(spec);
    expected.insert(key);
    if (!reader.contains(key))
      fail(reader.path(), ": tensor ", key, " is missing (expected shape ", shape_string(spec.shape), ", from ",
           m.config.lora->source, ")");
    if (reader.info(key).shape != spec.shape)
      fail(reader.path(), ": tensor ", key, " has shape ", shape_string(reader.info(key).shape), ", expected ",
           shape_string(spec.shape), " (", m.config.lora->source, " on ", m.config.source, ")");
  }
  for (const auto& [key, info] : reader.tensors())
    if (expected.count(key) == 0)
      fail(reader.path(), ": tensor ", key, " is not a trainable tensor of this adapter on ", m.config.source,
           " (", m.config.lora->source, ")");
  Buffer<T> staging(m.table.trainable_size());  // [trainable_size]: the trainable groups come first
  std::memcpy(static_cast<void*>(staging.data()), m.params.data(), m.table.trainable_size() * sizeof(T));
  for (const ParamSpec& spec : m.table.entries())
    if (spec.trainable()) reader.read(adapter_key(spec), spec.shape, staging.data() + spec.offset);
  std::memcpy(static_cast<void*>(m.params.data()), staging.data(), m.table.trainable_size() * sizeof(T));
}

template <class T>
void Model<T>::merge_adapter_into(Model<T>& plain) const {
  const Impl& m = *impl_;
  TRILLION_CHECK(m.config.lora != nullptr && plain.config().lora == nullptr, "merge_adapter_into: from a LoRA model ",
                 "into one without");
  constexpr std::string_view kA = ".lora_A.weight";
  for (const ParamSpec& target : plain.table().entries()) {
    const ParamSpec& source = m.table.find(target.name);
    TRILLION_CHECK(source.shape == target.shape, "merge_adapter_into: ", target.name, " differs in shape");
    std::memcpy(plain.params() + target.offset, m.params.data() + source.offset, target.numel() * sizeof(T));
  }
  for (const ParamSpec& a : m.table.entries()) {
    if (!a.adapter || !a.name.ends_with(kA)) continue;
    const std::string module = a.name.substr(0, a.name.size() - kA.size());
    const ParamSpec& b = m.table.find(module + ".lora_B.weight");
    const ParamSpec& weight = plain.table().find(module + ".weight");
    const int64_t rank = a.shape[0], in = a.shape[1], out = b.shape[0];
    // weight[out, in] += scaling · B[out, rank] · A[rank, in]
    gemm<T>(false, false, out, in, rank, T(m.config.lora->scaling_of(module)), m.params.data() + b.offset, rank,
            m.params.data() + a.offset, in, T(1), plain.params() + weight.offset, in, Operands::fp32);
  }
}

template void Model<float>::save_adapter(const std::string&) const;
template void Model<float>::load_adapter(const std::string&);
template void Model<double>::save_adapter(const std::string&) const;
template void Model<double>::load_adapter(const std::string&);
template void Model<float>::merge_adapter_into(Model<float>&) const;
template void Model<double>::merge_adapter_into(Model<double>&) const;

}  // namespace trillion
