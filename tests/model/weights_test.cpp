// Weights in Hugging Face safetensors layout: bitwise round trip, dtype conversion on load, and
// clear errors for missing, misshaped and extra tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test_configs.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;

class Weights : public ::testing::Test {
 protected:
  // The subdirectory `sub` of this test's scratch directory, made if missing.
  std::string dir(const std::string& sub) const {
    fs::create_directories(dir_.path(sub));
    return dir_.path(sub);
  }
  test::ScratchDir dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(Weights, SaveLoadRoundTripIsBitwise) {
  for (const char* name : {"tiny.json", "tiny_qwen3_next.json"}) {
    const ModelConfig config = ModelConfig::load(testing::model_config_path(name));
    Model<float> a(config), b(config);
    a.init_weights(1);
    b.init_weights(2);
    const std::string out = dir(name);
    a.save_weights(out);
    const SafetensorsReader file(out + "/model.safetensors");
    EXPECT_EQ(file.info("model.layers.1.self_attn.o_proj.weight").dtype, DType::F32);
    EXPECT_EQ(file.tensors().size(), a.table().entries().size());
    b.load_weights(out);
    EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.table().total_size() * sizeof(float))) << name;

    Model<double> d(config), e(config);  // double models write F64
    d.init_weights(3);
    d.save_weights(dir(std::string(name) + "_f64"));
    e.load_weights(dir(std::string(name) + "_f64"));
    EXPECT_EQ(0, std::memcmp(d.params(), e.params(), d.table().total_size() * sizeof(double))) << name;
    EXPECT_EQ(SafetensorsReader(dir(std::string(name) + "_f64") + "/model.safetensors").info("lm_head.weight").dtype,
              DType::F64);
    b.load_weights(dir(std::string(name) + "_f64"));  // converts F64 → float
    for (int64_t i = 0; i < d.table().total_size(); ++i) ASSERT_EQ(b.params()[i], static_cast<float>(d.params()[i]));
  }
}

TEST_F(Weights, ShardedCheckpointLoads) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny.json"));
  Model<float> a(config), b(config);
  a.init_weights(4);
  CheckpointWriter writer(/*max_shard_bytes=*/4096);
  for (const ParamSpec& s : a.table().entries()) writer.add(s.name, DType::F32, s.shape, a.params() + s.offset);
  writer.write(dir("sharded"));
  ASSERT_TRUE(fs::exists(dir("sharded") + "/model.safetensors.index.json"));
  b.load_weights(dir("sharded"));
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.table().total_size() * sizeof(float)));
}

// Writes every parameter of `model` except `skip`, with `reshape` given a wrong shape, plus `extra`.
void write_checkpoint(const Model<float>& model, const std::string& out, const std::string& skip,
                      const std::string& reshape, const std::string& extra) {
  CheckpointWriter writer;
  for (const ParamSpec& s : model.table().entries()) {
    if (s.name == skip) continue;
    std::vector<int64_t> shape = s.shape;
    if (s.name == reshape) shape = {s.numel()};
    writer.add(s.name, DType::F32, shape, model.params() + s.offset);
  }
  if (!extra.empty()) writer.add(extra, DType::F32, {1}, model.params());
  writer.write(out);
}

TEST_F(Weights, LoadErrorsNameTheTensorAndFile) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny.json"));
  Model<float> model(config);
  model.init_weights(1);
  const std::vector<float> before(model.params(), model.params() + model.table().total_size());

  write_checkpoint(model, dir("missing"), "model.layers.1.mlp.up_proj.weight", "", "");
  std::string message = error_of([&] { model.load_weights(dir("missing")); });
  EXPECT_NE(message.find("model.layers.1.mlp.up_proj.weight is missing"), std::string::npos) << message;
  EXPECT_NE(message.find(dir("missing")), std::string::npos) << message;

  write_checkpoint(model, dir("shape"), "", "model.layers.0.self_attn.k_proj.weight", "");
  message = error_of([&] { model.load_weights(dir("shape")); });
  EXPECT_NE(message.find("model.layers.0.self_attn.k_proj.weight has shape [128], expected [8, 16]"),
            std::string::npos) << message;
  EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;

  write_checkpoint(model, dir("extra"), "", "", "model.layers.2.mlp.up_proj.weight");
  message = error_of([&] { model.load_weights(dir("extra")); });
  EXPECT_NE(message.find("model.layers.2.mlp.up_proj.weight is not a parameter of this model"), std::string::npos)
      << message;

  // A failed load leaves the parameters unchanged.
  EXPECT_EQ(0, std::memcmp(before.data(), model.params(), before.size() * sizeof(float)));

  // An untied checkpoint (lm_head.weight is not the embedding) does not load into a tied model.
  Model<float> tied(testing::tiny_config_with({{"tie_word_embeddings", true}}));
  model.save_weights(dir("untied"));
  message = error_of([&] { tied.load_weights(dir("untied")); });
  EXPECT_NE(message.find("lm_head.weight differs from model.embed_tokens.weight but the config ties them"),
            std::string::npos) << message;
  EXPECT_NE(message.find(dir("untied")), std::string::npos) << message;
}

// A tied checkpoint that also stores lm_head.weight (as some Hugging Face ones do) loads when it is
// the embedding, bitwise after conversion (here F64 → float); a copy that differs in one element
// is rejected and leaves the parameters unchanged.
TEST_F(Weights, TiedModelAcceptsAStoredCopyOfTheEmbedding) {
  const ModelConfig config = testing::tiny_config_with({{"tie_word_embeddings", true}});
  Model<double> source(config);
  source.init_weights(5);
  const ParamSpec& embed = source.table().find("model.embed_tokens.weight");
  const auto write = [&](const std::string& out, double change) {
    CheckpointWriter writer;
    for (const ParamSpec& s : source.table().entries()) writer.add(s.name, DType::F64, s.shape, source.params() + s.offset);
    std::vector<double> head(source.params() + embed.offset, source.params() + embed.offset + embed.numel());
    head[7] += change;
    writer.add("lm_head.weight", DType::F64, embed.shape, head.data());
    writer.write(out);
  };
  Model<float> loaded(config);
  write(dir("copy"), 0.0);
  loaded.load_weights(dir("copy"));
  for (int64_t i = 0; i < source.table().total_size(); ++i)
    ASSERT_EQ(loaded.params()[i], static_cast<float>(source.params()[i])) << i;

  Model<float> other(config);
  other.init_weights(6);
  const std::vector<float> before(other.params(), other.params() + other.table().total_size());
  write(dir("differs"), 1e-3);
  const std::string message = error_of([&] { other.load_weights(dir("differs")); });
  EXPECT_NE(message.find("lm_head.weight differs from model.embed_tokens.weight"), std::string::npos) << message;
  EXPECT_EQ(0, std::memcmp(before.data(), other.params(), before.size() * sizeof(float)));
}

}  // namespace
}  // namespace trillion
