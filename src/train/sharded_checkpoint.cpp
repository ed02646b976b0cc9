// Sharded checkpoints: each rank's slices, the index, and reading them into any layout. See
// sharded_checkpoint.h.
#include "train/sharded_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

std::string shard_file_name(int rank, int ranks) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", rank, ranks);
  return name;
}

}  // namespace

bool is_sharded_checkpoint(const std::string& dir) { return fs::exists(fs::path(dir) / "shards" / "index.json"); }

template <class T>
void write_checkpoint_shard(const std::string& dir, const ShardLayout& layout, const T* params, const T* exp_avg,
                            const T* exp_avg_sq, const T* frozen) {
  SafetensorsWriter writer;
  const std::vector<ShardLayout::Slice>& slices = layout.slices();
  for (size_t k = 0; k < slices.size(); ++k) {
    const std::vector<int64_t> shape = {slices[k].count};
    writer.add("params." + std::to_string(k), dtype_of<T>(), shape, params + slices[k].local);
    writer.add("exp_avg." + std::to_string(k), dtype_of<T>(), shape, exp_avg + slices[k].local);
    writer.add("exp_avg_sq." + std::to_string(k), dtype_of<T>(), shape, exp_avg_sq + slices[k].local);
  }
  const std::vector<ShardLayout::Slice>& frozen_slices = layout.frozen_slices();
  for (size_t k = 0; k < frozen_slices.size(); ++k)
    writer.add("frozen." + std::to_string(k), dtype_of<T>(), {frozen_slices[k].count}, frozen + frozen_slices[k].local);
  writer.set_metadata("format", "trillion-sharded");
  writer.write((fs::path(dir) / "shards" / shard_file_name(layout.rank(), layout.ranks())).string());
}

template <class T>
void write_checkpoint_index(const std::string& dir, const ParamTable& table, int ranks, int ep, const T* params) {
  nlohmann::json slices = nlohmann::json::array(), frozen_slices = nlohmann::json::array();
  for (int rank = 0; rank < ranks; ++rank) {
    const ShardLayout layout(table, rank, ranks, ep);
    for (const auto& [list, of_rank] : {std::pair{&slices, &layout.slices()}, {&frozen_slices, &layout.frozen_slices()}})
      for (size_t k = 0; k < of_rank->size(); ++k)
        list->push_back({{"file", shard_file_name(rank, ranks)},
                         {"k", k},
                         {"global", (*of_rank)[k].global},
                         {"count", (*of_rank)[k].count}});
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const ParamSpec& spec : table.entries()) tensors.push_back({{"name", spec.name}, {"offset", spec.offset}});
  const nlohmann::json index = {{"format", "trillion-sharded"},
                                {"ranks", ranks},
                                {"ep", ep},
                                {"trainable_size", table.trainable_size()},
                                {"sharded_size", table.sharded_size()},
                                {"total_size", table.total_size()},
                                {"tensors", tensors},
                                {"slices", slices},
                                {"frozen_slices", frozen_slices}};
  const int64_t buffers = table.total_size() - table.sharded_size();
  SafetensorsWriter writer;
  writer.add("buffers", dtype_of<T>(), {buffers}, params + table.sharded_size());
  writer.write((fs::path(dir) / "shards" / "buffers.safetensors").string());
  write_file_atomic((fs::path(dir) / "shards" / "index.json").string(), index.dump(1) + "\n");
}

template <class T>
void read_sharded_checkpoint(const std::string& dir, const ParamTable& table, T* params, T* exp_avg, T* exp_avg_sq) {
  const std::string index_path = (fs::path(dir) / "shards" / "index.json").string();
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    fail(index_path, ": not valid JSON (", e.what(), ")");
  }
  const auto field = [&](const char* name) -> const nlohmann::json& {
    if (!index.is_object() || !index.contains(name)) fail(index_path, ": field '", name, "' is missing");
    return index.at(name);
  };
  if (field("format") != "trillion-sharded") fail(index_path, ": field 'format' is not \"trillion-sharded\"");
  if (field("trainable_size") != table.trainable_size() || field("total_size") != table.total_size()) {
    fail(index_path, ": fields 'trainable_size' / 'total_size' are ", field("trainable_size").dump(), " / ",
         field("total_size").dump(), "; the model config's parameter table has ", table.trainable_size(), " / ",
         table.total_size());
  }
  // The flat layout the slices address: every tensor where the table puts it (a table that orders
  // its units differently would otherwise read permuted weights).
  const nlohmann::json& tensors = field("tensors");
  if (!tensors.is_array() || tensors.size() != table.entries().size())
    fail(index_path, ": field 'tensors' lists ", tensors.is_array() ? tensors.size() : 0,
         " tensors; the model config's parameter table has ", table.entries().size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ParamSpec& spec = table.entries()[i];
    const nlohmann::json& tensor = tensors[i];
    if (!tensor.is_object() || !tensor.contains("name") || tensor.at("name") != spec.name || !tensor.contains("offset") ||
        tensor.at("offset") != spec.offset)
      fail(index_path, ": field 'tensors' entry ", i, " is ", tensors[i].dump(), "; the model config's parameter table has ",
           spec.name, " at flat offset ", spec.offset);
  }
  // Before LoRA's frozen base was sharded, index.json had no sharded_size: the buffers' range then
  // held the frozen groups too.
  const bool frozen_sharded = index.contains("sharded_size");
  if (frozen_sharded && index.at("sharded_size") != table.sharded_size())
    fail(index_path, ": field 'sharded_size' is ", index.at("sharded_size").dump(),
         "; the model config's parameter table has ", table.sharded_size());
  const int64_t sharded_size = frozen_sharded ? table.sharded_size() : table.trainable_size();
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  // Each slice of `list` (field `name`) into params[global, +count), which must lie in [begin, end);
  // a trainable one's moments too.
  const auto read_slices = [&](const char* name, int64_t begin, int64_t end, bool trainable) {
    const nlohmann::json& slices = field(name);
    if (!slices.is_array()) fail(index_path, ": field '", name, "' is ", slices.dump(), "; expected an array");
    for (size_t i = 0; i < slices.size(); ++i) {
      const nlohmann::json& slice = slices[i];
      const auto has = [&](const char* key, bool text) {
        return slice.is_object() && slice.contains(key) &&
               (text ? slice.at(key).is_string() : slice.at(key).is_number_integer());
      };
      if (!has("file", true) || !has("k", false) || !has("global", false) || !has("count", false))
        fail(index_path, ": field '", name, "' entry ", i, " is ", slice.dump(),
             "; expected {\"file\": a shard file name, \"k\", \"global\", \"count\": integers}");
      const std::string file = slice.at("file").get<std::string>();
      const int64_t global = slice.at("global").get<int64_t>(), count = slice.at("count").get<int64_t>();
      const int64_t k_index = slice.at("k").get<int64_t>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        fail(index_path, ": field '", name, "' entry ", i, " names the file \"", file,
             "\"; expected a plain name in shards/");
      if (k_index < 0) fail(index_path, ": field '", name, "' entry ", i, " has k ", k_index, "; expected k >= 0");
      if (global < begin || count < 0 || count > end - global)
        fail(index_path, ": slice [", global, ", +", count, ") of ", file, " lies outside the ",
             trainable ? "trainable" : "frozen", " elements");
      const std::string k = std::to_string(k_index);
      auto& reader = readers[file];
      if (!reader) reader = std::make_unique<SafetensorsReader>((fs::path(dir) / "shards" / file).string());
      if (!trainable) {
        reader->read("frozen." + k, {count}, params + global);
        continue;
      }
      reader->read("params." + k, {count}, params + global);
      if (exp_avg != nullptr) reader->read("exp_avg." + k, {count}, exp_avg + global);
      if (exp_avg_sq != nullptr) reader->read("exp_avg_sq." + k, {count}, exp_avg_sq + global);
    }
  };
  read_slices("slices", 0, table.trainable_size(), true);
  if (frozen_sharded) read_slices("frozen_slices", table.trainable_size(), sharded_size, false);
  const SafetensorsReader buffers((fs::path(dir) / "shards" / "buffers.safetensors").string());
  buffers.read("buffers", {table.total_size() - sharded_size}, params + sharded_size);
}

#define TRILLION_INSTANTIATE(T)                                                                                   \
  template void write_checkpoint_shard<T>(const std::string&, const ShardLayout&, const T*, const T*, const T*,    \
                                          const T*);                                                              \
  template void write_checkpoint_index<T>(const std::string&, const ParamTable&, int, int, const T*);             \
  template void read_sharded_checkpoint<T>(const std::string&, const ParamTable&, T*, T*, T*);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
