// The parameter table and its initialization: unit-major aligned offsets, unique names,
// initialization by (seed, name, index) only, initializers and weight decay per parameter kind,
// and the refusal of models too large for the table or the machine.
#include "model/params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "test_configs.h"

namespace trillion {
namespace {

ParamSpec spec(const std::string& name, std::vector<int64_t> shape, int unit, InitKind init = InitKind::normal) {
  ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.unit = unit;
  s.init = init;
  s.init_std = 0.5;
  return s;
}

TEST(ParamTable, UnitsAreAlignedAndPadded) {
  ParamTable table;
  table.add(spec("a", {3, 5}, 0));
  table.add(spec("b", {7}, 0));
  table.add(spec("c", {2, 2}, 1));
  table.add(spec("d", {65}, 2));
  table.finalize(16);
  EXPECT_EQ(table.find("a").offset, 0);
  EXPECT_EQ(table.find("b").offset, 15);
  EXPECT_EQ(table.find("c").offset, 32);
  EXPECT_EQ(table.find("d").offset, 48);
  ASSERT_EQ(table.units(ParamGroup::dense).size(), 3u);
  EXPECT_EQ(table.units(ParamGroup::dense)[0].begin, 0);
  EXPECT_EQ(table.units(ParamGroup::dense)[0].end, 32);
  EXPECT_EQ(table.units(ParamGroup::dense)[1].end, 48);
  EXPECT_EQ(table.units(ParamGroup::dense)[2].end, 48 + 80);
  EXPECT_EQ(table.total_size(), 128);
  EXPECT_EQ(table.num_elements(), 15 + 7 + 4 + 65);
}

// Groups are laid out one after another (dense | expert | lora | buffer), each unit-major and
// padded; the trainable prefix ends before the buffers; keys must tile their tensor in order.
TEST(ParamTable, GroupMajorLayoutWithTrainablePrefix) {
  ParamTable table;
  ParamSpec bias = spec("bias", {5}, 1);
  bias.group = ParamGroup::buffer;
  ParamSpec experts = spec("experts", {4, 3}, 1);
  experts.group = ParamGroup::expert;
  experts.hf_keys = {{"e0", {2, 3}, 0}, {"e1", {2, 3}, 6}};
  table.add(bias);
  table.add(experts);
  table.add(spec("w1", {10}, 1));
  table.add(spec("w0", {3}, 0));
  table.finalize(16);
  EXPECT_EQ(table.find("w0").offset, 0);
  EXPECT_EQ(table.find("w1").offset, 16);
  EXPECT_EQ(table.find("experts").offset, 32);
  EXPECT_EQ(table.find("bias").offset, 48);
  EXPECT_EQ(table.trainable_size(), 48);
  EXPECT_EQ(table.total_size(), 64);
  EXPECT_EQ(table.units(ParamGroup::expert)[1].begin, 32);
  EXPECT_EQ(table.units(ParamGroup::expert)[1].end, 48);
  EXPECT_EQ(table.units(ParamGroup::expert)[0].end - table.units(ParamGroup::expert)[0].begin, 0);
  EXPECT_FALSE(table.find("bias").trainable());
  EXPECT_EQ(table.find("experts").checkpoint_keys().size(), 2u);
  EXPECT_EQ(table.find("w0").checkpoint_keys().at(0).name, "w0");
  EXPECT_EQ(table.num_elements(ParamGroup::expert), 12);
  ParamTable bad;
  ParamSpec gap = spec("gap", {4}, 0);
  gap.hf_keys = {{"a", {2}, 0}, {"b", {2}, 3}};
  EXPECT_DEATH(bad.add(gap), "keys must tile");
}

// Untied: unit 0 the embeddings, 1 + l layer l, 1 + L the final norm and the LM head.
TEST(ParamTable, ModelTableIsUnitMajorWithUniqueNames) {
  Model<float> model(testing::tiny_config_with({}));
  const ParamTable& table = model.table();
  const ModelConfig& config = model.config();
  ASSERT_FALSE(config.tie_word_embeddings);
  ASSERT_EQ(static_cast<int64_t>(table.units(ParamGroup::dense).size()), 2 + config.num_hidden_layers);
  std::set<std::string> names;
  int64_t previous_end = 0;
  for (const ParamSpec& s : table.entries()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    const ParamTable::UnitRange& unit = table.units(ParamGroup::dense)[s.unit];
    EXPECT_GE(s.offset, unit.begin) << s.name;
    EXPECT_LE(s.offset + s.numel(), unit.end) << s.name;
    EXPECT_GE(s.offset, previous_end) << s.name;  // no overlap
    previous_end = s.offset + s.numel();
    if (s.name.rfind("model.layers.", 0) == 0) {
      EXPECT_EQ(s.unit, 1 + std::stoi(s.name.substr(13))) << s.name;
    } else {
      EXPECT_EQ(s.unit, s.name == "model.embed_tokens.weight" ? 0 : 1 + config.num_hidden_layers) << s.name;
    }
  }
  for (const ParamTable::UnitRange& unit : table.units(ParamGroup::dense)) {
    EXPECT_EQ(unit.begin % 64, 0);
    EXPECT_EQ(unit.end % 64, 0);
  }
  EXPECT_EQ(table.find("model.layers.1.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{config.num_attention_heads * config.head_dim, config.hidden_size}));
  EXPECT_EQ(table.find("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{config.hidden_size, config.intermediate_size}));
}

TEST(ParamTable, InitDependsOnlyOnSeedNameAndIndex) {
  ParamTable one, two;
  one.add(spec("x", {10}, 0));
  one.add(spec("w", {33}, 0));
  two.add(spec("w", {33}, 0));  // same tensor, other position and unit layout
  two.add(spec("y", {4}, 1));
  one.finalize(8);
  two.finalize(64);
  std::vector<double> a(one.total_size(), 7.0), b(two.total_size(), 7.0), c(two.total_size());
  init_parameters(one, a.data(), 42);
  init_parameters(two, b.data(), 42);
  init_parameters(two, c.data(), 43);
  const CounterRng rng(42, "w");
  for (int64_t i = 0; i < 33; ++i) {
    EXPECT_EQ(a[one.find("w").offset + i], b[two.find("w").offset + i]);
    EXPECT_EQ(b[two.find("w").offset + i], rng.normal(i) * 0.5);
    EXPECT_NE(b[two.find("w").offset + i], c[two.find("w").offset + i]);
  }
  for (int64_t i = one.find("w").offset + 33; i < one.total_size(); ++i) EXPECT_EQ(a[i], 0.0) << "padding " << i;
  // float is the double value rounded.
  std::vector<float> f(two.total_size());
  init_parameters(two, f.data(), 42);
  for (int64_t i = 0; i < two.total_size(); ++i) EXPECT_EQ(f[i], static_cast<float>(b[i]));
}

TEST(ParamTable, InitializersAndWeightDecayPerKind) {
  for (const bool zero_centred : {false, true}) {
    const ModelConfig config = zero_centred ? testing::tiny_config_with({}, "tiny_qwen3_next.json")
                                            : testing::tiny_config_with({});
    Model<double> model(config);
    model.init_weights(5);
    const double range = config.initializer_range;
    const double out_std = range / std::sqrt(2.0 * double(config.num_hidden_layers));
    for (const ParamSpec& s : model.table().entries()) {
      const bool is_norm = s.name.find("norm") != std::string::npos;
      const bool is_output = s.name.find("o_proj") != std::string::npos || s.name.find("down_proj") != std::string::npos;
      const bool is_embedding = s.name == "model.embed_tokens.weight";
      EXPECT_EQ(s.weight_decay, !is_norm && !is_embedding) << s.name;
      if (is_norm) {
        EXPECT_EQ(s.init, zero_centred ? InitKind::zeros : InitKind::ones) << s.name;
        for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(model.params()[s.offset + i], zero_centred ? 0.0 : 1.0);
      } else {
        EXPECT_EQ(s.init, InitKind::normal) << s.name;
        EXPECT_DOUBLE_EQ(s.init_std, is_output ? out_std : range) << s.name;
        const CounterRng rng(5, s.name);
        for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(model.params()[s.offset + i], rng.normal(i) * s.init_std);
      }
    }
    if (zero_centred) {  // gated q_proj: 2·Hq·d rows
      EXPECT_EQ(model.table().find("model.layers.0.self_attn.q_proj.weight").shape[0],
                2 * config.num_attention_heads * config.head_dim);
    }
  }
}

// Tied: no LM head, and the final norm is unit 0's, with the embeddings.
TEST(ParamTable, TiedModelHasNoLmHead) {
  Model<float> tied(testing::tiny_config_with({{"tie_word_embeddings", true}}));
  Model<float> untied(testing::tiny_config_with({}));
  EXPECT_FALSE(tied.table().contains("lm_head.weight"));
  EXPECT_EQ(tied.table().find("model.norm.weight").unit, 0);
  EXPECT_EQ(static_cast<int64_t>(tied.table().units(ParamGroup::dense).size()), 1 + tied.config().num_hidden_layers);
  EXPECT_TRUE(untied.table().contains("lm_head.weight"));
  EXPECT_TRUE(untied.table().find("lm_head.weight").weight_decay);
}

// Sizes whose products pass 2^50 elements are refused with the tensor named (before any byte count
// could overflow int64); a model that fits the table but not the machine is refused before its
// buffers are allocated, with the bytes it needs.
TEST(ParamTable, OversizedModelsAreRefusedBeforeAllocation) {
  try {
    Model<float> model(testing::tiny_config_with({{"hidden_size", 2147483647}, {"intermediate_size", 2147483647}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("of shape [2147483647, 2147483647] has more than 2^50 elements"),
              std::string::npos)
        << e.what();
  }
  try {
    Model<float> model(testing::tiny_config_with({{"head_dim", 1000000000}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(": the model needs "), std::string::npos) << message;
    EXPECT_NE(message.find(" for its parameters ("), std::string::npos) << message;
    EXPECT_NE(message.find(" available ("), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace trillion
