// Checkpoint directories: single-file and sharded round trips (shard sizes, index contents,
// total_size), the sharded fixture laid out as transformers writes it, replacing one layout by the
// other, and the errors for a missing shard, a tensor absent from its shard, an unknown tensor
// and a directory that holds no checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;
using test::ScratchDir;
using testing::write_bytes;

const std::string kShardedFixture = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/safetensors/sharded";

std::vector<double> ramp(int count, double start) {
  std::vector<double> values(count);
  for (int i = 0; i < count; ++i) values[i] = start + 0.25 * i;
  return values;
}

TEST(Checkpoint, ShardedRoundTrip) {
  ScratchDir dir;
  const std::vector<double> embed = ramp(12, 1.0);  // [4, 3]
  const std::vector<double> norm = ramp(3, -1.0);   // [3]
  const std::vector<double> proj = ramp(15, 5.0);   // [3, 5]
  CheckpointWriter writer(64);                       // bytes per shard
  writer.add("embed", DType::F32, {4, 3}, embed.data());     // 48 bytes: shard 1
  writer.add("norm", DType::F64, {3}, norm.data());          // 24 bytes: 72 > 64, shard 2
  writer.add("proj", DType::BF16, {3, 5}, proj.data());      // 30 bytes: 54 <= 64, shard 2
  writer.add("big", DType::F64, {3, 5}, proj.data());        // 120 bytes alone: shard 3
  writer.write(dir.path());

  EXPECT_FALSE(std::filesystem::exists(dir.path("model.safetensors")));
  for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir.path(shard))) << shard;
  const nlohmann::json index = nlohmann::json::parse(read_file(dir.path("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 48 + 24 + 30 + 120);
  EXPECT_EQ(index["weight_map"]["embed"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["norm"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["proj"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00003-of-00003.safetensors");

  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"big", "embed", "norm", "proj"}));
  EXPECT_TRUE(reader.contains("norm"));
  EXPECT_FALSE(reader.contains("lm_head"));
  std::vector<double> out_embed(12), out_norm(3), out_big(15);
  std::vector<float> out_proj(15);
  reader.read("embed", {4, 3}, out_embed.data());
  reader.read("norm", {3}, out_norm.data());
  reader.read("proj", {3, 5}, out_proj.data());
  reader.read("big", {3, 5}, out_big.data());
  EXPECT_EQ(out_embed, embed);  // quarter steps are exact in F32
  EXPECT_EQ(out_norm, norm);
  EXPECT_EQ(out_big, proj);
  EXPECT_EQ(out_proj[14], 8.5f);
  EXPECT_EQ(reader.shard_of("proj").path(), dir.path("model-00002-of-00003.safetensors"));
}

TEST(Checkpoint, SingleFileReplacesShardedAndBack) {
  ScratchDir dir;
  const std::vector<float> a = {1, 2, 3, 4};  // [4]
  CheckpointWriter sharded(8);
  sharded.add("a", DType::F32, {2}, a.data());
  sharded.add("b", DType::F32, {2}, a.data() + 2);
  sharded.write(dir.path());
  EXPECT_TRUE(std::filesystem::exists(dir.path("model.safetensors.index.json")));

  CheckpointWriter single;
  single.add("a", DType::F32, {4}, a.data());
  single.write(dir.path());
  EXPECT_TRUE(std::filesystem::exists(dir.path("model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.path("model.safetensors.index.json")));
  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.names(), std::vector<std::string>{"a"});
  std::vector<float> out(4);
  reader.read("a", {4}, out.data());
  EXPECT_EQ(out, a);

  sharded.write(dir.path());
  EXPECT_FALSE(std::filesystem::exists(dir.path("model.safetensors")));
  EXPECT_EQ(CheckpointReader(dir.path()).names(), (std::vector<std::string>{"a", "b"}));
}

TEST(Checkpoint, ReadsTheShardedFixture) {
  CheckpointReader reader(kShardedFixture);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"a", "b"}));
  std::vector<float> a(2);
  std::vector<double> b(2);
  reader.read("a", {2}, a.data());
  reader.read("b", {1, 2}, b.data());
  EXPECT_EQ(a, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(b, (std::vector<double>{3.0, 4.0}));
}

TEST(Checkpoint, RejectsBrokenCheckpoints) {
  ScratchDir dir;
  EXPECT_EQ(error_message([&] { CheckpointReader reader(dir.path()); }),
            dir.path() + ": not a checkpoint: expected model.safetensors or model.safetensors.index.json in it");

  const std::vector<float> a = {1, 2};
  SafetensorsWriter shard;
  shard.add("a", DType::F32, {2}, a.data());
  shard.write(dir.path("shard-1.safetensors"));
  const std::string index_path = dir.path("model.safetensors.index.json");

  write_bytes(index_path, R"({"weight_map": {"a": "shard-1.safetensors", "b": "shard-2.safetensors"}})");
  std::string message = error_message([&] { CheckpointReader reader(dir.path()); });
  EXPECT_NE(message.find(index_path + ": shard \"shard-2.safetensors\" (holding tensor \"b\") does not exist"),
            std::string::npos)
      << message;

  write_bytes(index_path, R"({"weight_map": {"a": "shard-1.safetensors", "c": "shard-1.safetensors"}})");
  message = error_message([&] { CheckpointReader reader(dir.path()); });
  EXPECT_EQ(message, index_path + ": tensor \"c\" is mapped to shard \"shard-1.safetensors\", which does not contain it");

  write_bytes(index_path, R"({"weight_map": {"a": "../shard-1.safetensors"}})");
  message = error_message([&] { CheckpointReader reader(dir.path()); });
  EXPECT_NE(message.find("field \"weight_map\"[\"a\"] is \"../shard-1.safetensors\"; expected a file name"),
            std::string::npos)
      << message;

  write_bytes(index_path, R"({"metadata": {}})");
  message = error_message([&] { CheckpointReader reader(dir.path()); });
  EXPECT_NE(message.find(index_path + ": field \"weight_map\" missing or not an object"), std::string::npos) << message;

  write_bytes(index_path, R"({"weight_map": {"a": "shard-1.safetensors"}})");
  CheckpointReader reader(dir.path());
  std::vector<float> out(2);
  message = error_message([&] { reader.read("lm_head.weight", {2}, out.data()); });
  EXPECT_EQ(message, dir.path() + ": checkpoint has no tensor \"lm_head.weight\"");
  message = error_message([&] { reader.read("a", {1, 2}, out.data()); });
  EXPECT_EQ(message, dir.path("shard-1.safetensors") + ": tensor \"a\": shape [2]; expected [1, 2]");
}

TEST(Checkpoint, WriterRejectsDuplicateNamesAcrossShards) {
  const std::vector<float> a = {1, 2, 3, 4};
  CheckpointWriter writer(8);
  writer.add("a", DType::F32, {2}, a.data());
  writer.add("b", DType::F32, {2}, a.data());
  EXPECT_EQ(error_message([&] { writer.add("a", DType::F32, {2}, a.data()); }),
            "checkpoint writer: tensor \"a\" added twice");
}

}  // namespace
}  // namespace trillion
