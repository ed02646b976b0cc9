// Model weights in Hugging Face layout: save_weights writes every tensor of the parameter table
// under its checkpoint keys (save_pretrained's default layout: routed experts per expert,
// `mlp.experts.{e}.gate_proj.weight`, …; F32 for float models, F64 for double, or BF16) through
// CheckpointWriter (sharded with an index when large); load_weights reads that layout and the fused
// in-memory one (`save_original_format=False`: `mlp.experts.gate_up_proj [E, 2I, H]`, …), any
// supported dtype, converting. Loading is all-or-nothing: every tensor is read into a staging buffer
// and checked (missing, misshaped, extra) before the parameters change. A tied model accepts a
// stored lm_head.weight only when it equals model.embed_tokens.weight bitwise after conversion.
// A LoRA model's adapter pairs are not the model's: both leave them alone (adapter_weights.cpp
// reads and writes them).
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model_impl.h"

namespace trillion {

template <class T>
void Model<T>::save_weights(const std::string& directory, bool bfloat16) const {
  const Impl& m = *impl_;
  CheckpointWriter writer;
  const DType stored = bfloat16 ? DType::BF16 : dtype_of<T>();
  for (const ParamSpec& spec : m.table.entries()) {
    if (spec.adapter) continue;
    // A bf16-only base's linear weights: from the copy, the values every product used.
    const bool in_bf16_only = !m.released_ranges.empty() && held_in_bf16_only(spec);
    for (const HfKey& key : spec.checkpoint_keys()) {
      if (in_bf16_only)
        writer.add(key.name, DType::BF16, key.shape, m.bf16_params->data() + spec.offset + key.offset);
      else
        writer.add(key.name, stored, key.shape, m.params.data() + spec.offset + key.offset);
    }
  }
  writer.write(directory);
}

template <class T>
void Model<T>::load_weights(const std::string& directory) {
  Impl& m = *impl_;
  m.restore_base();
  const CheckpointReader reader(directory);
  // Each parameter as the checkpoint stores it: fused under its own name, else by its keys.
  std::vector<std::vector<HfKey>> stored(m.table.entries().size());
  std::set<std::string> consumed;
  for (size_t i = 0; i < m.table.entries().size(); ++i) {
    const ParamSpec& spec = m.table.entries()[i];
    if (spec.adapter) continue;
    stored[i] = reader.contains(spec.name) ? std::vector<HfKey>{{spec.name, spec.shape, 0}} : spec.checkpoint_keys();
    for (const HfKey& key : stored[i]) {
      if (!reader.contains(key.name))
        fail("checkpoint ", directory, ": tensor ", key.name, " is missing (expected shape ", shape_string(key.shape),
             key.name != spec.name ? ", or " + spec.name + " " + shape_string(spec.shape) + " in the fused layout" : "",
             ")");
      const SafetensorsReader& shard = reader.shard_of(key.name);
      const std::vector<int64_t>& shape = shard.info(key.name).shape;
      if (shape != key.shape)
        fail(shard.path(), ": tensor ", key.name, " has shape ", shape_string(shape), ", expected ", shape_string(key.shape));
      consumed.insert(key.name);
    }
  }
  // Hugging Face tied checkpoints sometimes also store lm_head.weight: a copy of the embedding.
  const char* const kTiedHead = "lm_head.weight";
  const bool tied_head_stored = m.config.tie_word_embeddings && reader.contains(kTiedHead);
  for (const std::string& name : reader.names()) {
    if (consumed.count(name) == 0 && !(tied_head_stored && name == kTiedHead))
      fail(reader.shard_of(name).path(), ": tensor ", name, " is not a parameter of this model (",
           m.config.model_type, ", ", m.config.num_hidden_layers, " layers",
           m.config.tie_word_embeddings ? ", tied embeddings" : "", ")");
  }
  Buffer<T> staging(m.table.total_size());  // the adapters' values kept, padding zero
  std::memcpy(static_cast<void*>(staging.data()), m.params.data(), m.table.total_size() * sizeof(T));
  for (size_t i = 0; i < m.table.entries().size(); ++i) {
    for (const HfKey& key : stored[i])
      reader.read(key.name, key.shape, staging.data() + m.table.entries()[i].offset + key.offset);
  }
  if (tied_head_stored) {
    const ParamSpec& embed = m.table.find("model.embed_tokens.weight");
    const SafetensorsReader& shard = reader.shard_of(kTiedHead);
    if (shard.info(kTiedHead).shape != embed.shape)
      fail(shard.path(), ": tensor ", kTiedHead, " has shape ", shape_string(shard.info(kTiedHead).shape), ", expected ",
           shape_string(embed.shape), " (tie_word_embeddings = true: a copy of ", embed.name, ")");
    Buffer<T> head(embed.numel());  // [V, D]
    reader.read(kTiedHead, embed.shape, head.data());
    if (std::memcmp(head.data(), staging.data() + embed.offset, embed.numel() * sizeof(T)) != 0)
      fail(shard.path(), ": tensor ", kTiedHead, " differs from ", embed.name,
           " but the config ties them (tie_word_embeddings = true); expected an identical copy or no ", kTiedHead);
  }
  std::memcpy(static_cast<void*>(m.params.data()), staging.data(), m.table.total_size() * sizeof(T));
}

template void Model<float>::save_weights(const std::string&, bool) const;
template void Model<float>::load_weights(const std::string&);
template void Model<double>::save_weights(const std::string&, bool) const;
template void Model<double>::load_weights(const std::string&);

}  // namespace trillion
