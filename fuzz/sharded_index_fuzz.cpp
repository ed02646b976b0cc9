// libFuzzer target: a sharded checkpoint's shards/index.json (format, sizes, the tensor list that
// must match the parameter table, each shard file's slices) read against a two-tensor table, next
// to one valid shard file it may name.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "fuzz_input.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "train/sharded_checkpoint.h"

namespace {

trillion::ParamSpec spec(const std::string& name, std::vector<int64_t> shape, int unit) {
  trillion::ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.unit = unit;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const trillion::ParamTable table = [] {
    trillion::ParamTable t;
    t.add(spec("model.embed_tokens.weight", {8, 4}, 0));
    t.add(spec("model.norm.weight", {4}, 1));
    t.finalize(16);
    return t;
  }();
  static const std::string dir = [] {
    const std::filesystem::path d = trillion::fuzz::scratch_dir() / "checkpoint";
    std::filesystem::create_directories(d / "shards");
    const int64_t trainable = table.trainable_size(), buffers = table.total_size() - trainable;
    const std::vector<float> values(static_cast<size_t>(table.total_size()), 0.5f);
    trillion::SafetensorsWriter shard;  // rank 0 of 1: one slice, flat [0, trainable)
    shard.add("params.0", trillion::DType::F32, {trainable}, values.data());
    shard.add("exp_avg.0", trillion::DType::F32, {trainable}, values.data());
    shard.add("exp_avg_sq.0", trillion::DType::F32, {trainable}, values.data());
    shard.write((d / "shards" / "rank-00000-of-00001.safetensors").string());
    trillion::SafetensorsWriter rest;
    rest.add("buffers", trillion::DType::F32, {buffers}, values.data());
    rest.write((d / "shards" / "buffers.safetensors").string());
    return d.string();
  }();
  trillion::fuzz::write_input(data, size, "index.json", "checkpoint/shards");
  std::vector<float> params(table.total_size()), avg(table.trainable_size()), avg_sq(table.trainable_size());
  try {
    trillion::read_sharded_checkpoint(dir, table, params.data(), avg.data(), avg_sq.data());
  } catch (const trillion::Error&) {
  }
  return 0;
}
