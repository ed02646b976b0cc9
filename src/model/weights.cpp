// Model weights in Hugging Face layout: save_weights writes every tensor of the parameter table
// under its HF name (F32 for float models, F64 for double) through CheckpointWriter (sharded with
// an index when large); load_weights reads any supported dtype, converting. Loading is
// all-or-nothing: every tensor is read into a staging buffer and checked (missing, misshaped,
// extra) before the parameters change. A tied model accepts a stored lm_head.weight only when it
// equals model.embed_tokens.weight bitwise after conversion.
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model_impl.h"

namespace trillion {

template <class T>
void Model<T>::save_weights(const std::string& directory) const {
  const Impl& m = *impl_;
  CheckpointWriter writer;
  for (const ParamSpec& spec : m.table.entries()) {
    writer.add(spec.name, dtype_of<T>(), spec.shape, m.params.data() + spec.offset);
  }
  writer.write(directory);
}

template <class T>
void Model<T>::load_weights(const std::string& directory) {
  Impl& m = *impl_;
  const CheckpointReader reader(directory);
  for (const ParamSpec& spec : m.table.entries()) {
    if (!reader.contains(spec.name))
      fail("checkpoint ", directory, ": tensor ", spec.name, " is missing (expected shape ", shape_string(spec.shape), ")");
    const SafetensorsReader& shard = reader.shard_of(spec.name);
    const std::vector<int64_t>& shape = shard.info(spec.name).shape;
    if (shape != spec.shape)
      fail(shard.path(), ": tensor ", spec.name, " has shape ", shape_string(shape), ", expected ", shape_string(spec.shape));
  }
  // Hugging Face tied checkpoints sometimes also store lm_head.weight: a copy of the embedding.
  const char* const kTiedHead = "lm_head.weight";
  const bool tied_head_stored = m.config.tie_word_embeddings && reader.contains(kTiedHead);
  for (const std::string& name : reader.names()) {
    if (!m.table.contains(name) && !(tied_head_stored && name == kTiedHead))
      fail(reader.shard_of(name).path(), ": tensor ", name, " is not a parameter of this model (",
           m.config.model_type, ", ", m.config.num_hidden_layers, " layers",
           m.config.tie_word_embeddings ? ", tied embeddings" : "", ")");
  }
  Buffer<T> staging(m.table.total_size());  // padding stays zero
  for (const ParamSpec& spec : m.table.entries()) reader.read(spec.name, spec.shape, staging.data() + spec.offset);
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

template void Model<float>::save_weights(const std::string&) const;
template void Model<float>::load_weights(const std::string&);
template void Model<double>::save_weights(const std::string&) const;
template void Model<double>::load_weights(const std::string&);

}  // namespace trillion
