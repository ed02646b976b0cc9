// Checkpoint directories in the Hugging Face layout (see safetensors.h): a single
// `model.safetensors`, or shards `model-0000i-of-0000N.safetensors` listed by
// `model.safetensors.index.json` = {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}.
//
// Writing puts the shards down first and the index last (each atomically), so the index is the
// commit point: a reader sees either the old checkpoint or the complete new one.
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace trillion {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string join(const std::string& directory, const std::string& file) {
  return (std::filesystem::path(directory) / file).string();
}

std::string shard_file_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// The weight_map of an index file: tensor name → shard file name (a plain name in the directory).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path));
  } catch (const nlohmann::json::exception& error) {
    fail(index_path, ": not valid JSON: ", error.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(index_path, ": field \"weight_map\" missing or not an object; expected {tensor name: shard file}");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      fail(index_path, ": field \"weight_map\"[\"", name, "\"] is ", shard.dump(), "; expected a shard file name");
    const std::string file = shard.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail(index_path, ": field \"weight_map\"[\"", name, "\"] is \"", file,
           "\"; expected a file name inside the checkpoint directory");
    weight_map[name] = file;
  }
  return weight_map;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& directory) : directory_(directory) {
  const std::string index_path = join(directory, kIndexFile);
  const std::string single_path = join(directory, kSingleFile);
  if (std::filesystem::exists(index_path)) {
    const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : weight_map) {
      auto [it, inserted] = shard_of_file.emplace(file, shards_.size());
      if (inserted) {
        const std::string shard_path = join(directory, file);
        if (!std::filesystem::exists(shard_path))
          fail(index_path, ": shard \"", file, "\" (holding tensor \"", name, "\") does not exist: ", shard_path);
        shards_.emplace_back(shard_path);
      }
      if (!shards_[it->second].contains(name))
        fail(index_path, ": tensor \"", name, "\" is mapped to shard \"", file, "\", which does not contain it");
      shard_index_[name] = it->second;
    }
  } else if (std::filesystem::exists(single_path)) {
    shards_.emplace_back(single_path);
    for (const auto& [name, info] : shards_[0].tensors()) shard_index_[name] = 0;
  } else {
    fail(directory, ": not a checkpoint: expected ", kSingleFile, " or ", kIndexFile, " in it");
  }
}

bool CheckpointReader::contains(const std::string& name) const { return shard_index_.count(name) != 0; }

const SafetensorsReader& CheckpointReader::shard_of(const std::string& name) const {
  auto it = shard_index_.find(name);
  if (it == shard_index_.end()) fail(directory_, ": checkpoint has no tensor \"", name, "\"");
  return shards_[it->second];
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> names;
  for (const auto& [name, shard] : shard_index_) names.push_back(name);
  return names;
}

template <class T>
void CheckpointWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const T* data) {
  for (const auto& [existing, shard] : placement_) {
    if (existing == name) fail("checkpoint writer: tensor \"", name, "\" added twice");
  }
  int64_t bytes = dtype_bytes(dtype);
  for (int64_t dim : shape) bytes *= dim;
  // A tensor larger than the limit gets a shard of its own.
  if (shards_.empty() || (shards_.back().data_bytes() > 0 && shards_.back().data_bytes() + bytes > max_shard_bytes_))
    shards_.emplace_back();
  shards_.back().add(name, dtype, shape, data);
  placement_.emplace_back(name, shards_.size() - 1);
}

void CheckpointWriter::write(const std::string& directory) const {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) fail(directory, ": cannot create checkpoint directory: ", error.message());
  const std::string index_path = join(directory, kIndexFile);
  const std::string single_path = join(directory, kSingleFile);

  if (shards_.size() <= 1) {
    if (shards_.empty()) {
      SafetensorsWriter().write(single_path);
    } else {
      shards_[0].write(single_path);
    }
    std::filesystem::remove(index_path, error);  // a stale index would shadow the new file
    return;
  }

  int64_t total_size = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    shards_[i].write(join(directory, shard_file_name(i, shards_.size())));
    total_size += shards_[i].data_bytes();
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [name, shard] : placement_) weight_map[name] = shard_file_name(shard, shards_.size());
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  write_file_atomic(index_path, index.dump(2) + "\n");
  std::filesystem::remove(single_path, error);  // the index now wins; drop an older single file
}

template void CheckpointWriter::add<float>(const std::string&, DType, const std::vector<int64_t>&, const float*);
template void CheckpointWriter::add<double>(const std::string&, DType, const std::vector<int64_t>&, const double*);
template void CheckpointWriter::add<bf16>(const std::string&, DType, const std::vector<int64_t>&, const bf16*);

}  // namespace trillion
