// Sharded checkpoints in one process: every rank's shard of a (4 ranks, ep 2) layout written, the
// index beside them, read back into the flat layout bit for bit (parameters, both moments and the
// buffers; with LoRA the frozen base's slices too); an index whose flat layout is not the model
// table's (a tensor at another offset, or no layout at all) is refused, naming the file, the field
// and the tensor; an index written before the frozen base was sharded reads as before.
#include "train/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "model/lora_config.h"
#include "model/model.h"
#include "model/test_configs.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using test::ScratchDir;

constexpr int kRanks = 4, kEp = 2;

// tiny_qwen3_moe, with LoRA on attention and the routed experts (a frozen base) or without.
ModelConfig config_of(bool lora) {
  ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json"));
  if (lora)
    config.lora = std::make_shared<const LoraConfig>(LoraConfig::from_flags(2, 4, "q_proj,v_proj", "gate_up_proj,down_proj"));
  return config;
}

class ShardedCheckpoint : public ::testing::TestWithParam<bool> {  // LoRA or not
 protected:
  ShardedCheckpoint() : model_(config_of(GetParam())) {
    model_.init_weights(3);
    const int64_t trainable = model_.table().trainable_size();
    exp_avg_.resize(trainable);
    exp_avg_sq_.resize(trainable);
    for (int64_t i = 0; i < trainable; ++i) {
      exp_avg_[i] = 0.5 * model_.params()[i] + 1.0;
      exp_avg_sq_[i] = double(i) * 1e-3;
    }
    fs::create_directories(fs::path(dir_.path()) / "shards");
    for (int rank = 0; rank < kRanks; ++rank) {  // what each rank of the run would write
      const ShardLayout layout(model_.table(), rank, kRanks, kEp);
      std::vector<double> params(layout.shard_size()), m(layout.shard_size()), v(layout.shard_size());
      std::vector<double> frozen(layout.frozen_shard_size());  // [frozen shard size]
      layout.copy_to_shard(model_.params(), params.data());
      layout.copy_to_shard(exp_avg_.data(), m.data());
      layout.copy_to_shard(exp_avg_sq_.data(), v.data());
      layout.copy_to_shard(model_.params(), frozen.data(), /*frozen=*/true);
      write_checkpoint_shard(dir_.path(), layout, params.data(), m.data(), v.data(), frozen.data());
    }
    write_checkpoint_index(dir_.path(), model_.table(), kRanks, kEp, model_.params());
  }
  std::string index_path() const { return (fs::path(dir_.path()) / "shards" / "index.json").string(); }

  ScratchDir dir_;
  Model<double> model_;
  std::vector<double> exp_avg_, exp_avg_sq_;  // [trainable_size] each
};

TEST_P(ShardedCheckpoint, ReadsBackIntoTheFlatLayoutBitForBit) {
  ASSERT_TRUE(is_sharded_checkpoint(dir_.path()));
  const ParamTable& table = model_.table();
  EXPECT_EQ(table.sharded_size() > table.trainable_size(), GetParam()) << "LoRA's frozen base";
  std::vector<double> params(table.total_size(), -1.0), m(table.trainable_size()), v(table.trainable_size());
  read_sharded_checkpoint(dir_.path(), table, params.data(), m.data(), v.data());
  for (const ParamSpec& spec : table.entries()) {  // padding belongs to no tensor
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i) {
      ASSERT_EQ(params[i], model_.params()[i]) << spec.name << " element " << i - spec.offset;
      if (!spec.trainable()) continue;
      ASSERT_EQ(m[i], exp_avg_[i]) << spec.name;
      ASSERT_EQ(v[i], exp_avg_sq_[i]) << spec.name;
    }
  }
}

TEST_P(ShardedCheckpoint, AnIndexOfAnotherFlatLayoutIsRefused) {
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  const ParamTable& table = model_.table();
  std::vector<double> params(table.total_size());
  const auto read = [&] { read_sharded_checkpoint<double>(dir_.path(), table, params.data(), nullptr, nullptr); };

  nlohmann::json moved = index;
  moved["tensors"][1]["offset"] = moved["tensors"][1]["offset"].get<int64_t>() + 64;
  write_file_atomic(index_path(), moved.dump());
  const std::string message = error_message(read);
  EXPECT_NE(message.find(index_path()), std::string::npos) << message;
  EXPECT_NE(message.find("field 'tensors' entry 1"), std::string::npos) << message;
  EXPECT_NE(message.find(table.entries()[1].name + " at flat offset " + std::to_string(table.entries()[1].offset)),
            std::string::npos)
      << message;

  nlohmann::json unlaid = index;
  unlaid.erase("tensors");  // an index written before the layout was recorded
  write_file_atomic(index_path(), unlaid.dump());
  EXPECT_EQ(error_message(read), index_path() + ": field 'tensors' is missing");
}

// Before the frozen base was sharded an index had no sharded_size or frozen_slices, and its
// buffers file held the flat [trainable_size, total_size), a LoRA base's frozen tensors included:
// such a checkpoint reads as before.
TEST_P(ShardedCheckpoint, AnIndexWrittenBeforeTheFrozenBaseWasShardedReadsAsBefore) {
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  index.erase("sharded_size");
  index.erase("frozen_slices");
  write_file_atomic(index_path(), index.dump());
  const ParamTable& table = model_.table();
  SafetensorsWriter buffers;
  buffers.add("buffers", dtype_of<double>(), {table.total_size() - table.trainable_size()},
              model_.params() + table.trainable_size());
  buffers.write((fs::path(dir_.path()) / "shards" / "buffers.safetensors").string());
  std::vector<double> params(table.total_size(), -1.0);
  read_sharded_checkpoint<double>(dir_.path(), table, params.data(), nullptr, nullptr);
  for (const ParamSpec& spec : table.entries())
    for (int64_t i = spec.offset; i < spec.offset + spec.numel(); ++i)
      ASSERT_EQ(params[i], model_.params()[i]) << spec.name << " element " << i - spec.offset;
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutLora, ShardedCheckpoint, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Lora" : "Plain"; });

}  // namespace
}  // namespace trillion
