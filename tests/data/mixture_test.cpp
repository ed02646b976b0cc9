// Data mixtures: the --data spec and its errors; over 10⁵ windows each source's share is its
// weight within 2 % relative; a restored state continues bitwise; one source is exactly the plain
// Sampler; directories of different tokenizers are refused by name.
#include "data/mixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "data/data_test_util.h"
#include "data/tokenizer.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::expect_error;

TEST(DataMixtureSpec, ParsesDirectoriesAndWeights) {
  const std::vector<DataSource> one = parse_data_mixture("data/a");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].directory, "data/a");
  EXPECT_EQ(one[0].weight, 1.0);
  const std::vector<DataSource> two = parse_data_mixture("a:0.7,/x/b:0.3");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].directory, "/x/b");
  EXPECT_EQ(two[0].weight, 0.7);
  EXPECT_EQ(parse_data_mixture(format_data_mixture(two))[1].weight, 0.3) << "the saved spec parses back";
  expect_error([] { parse_data_mixture("a:0.7,"); }, {"an empty item"});
  expect_error([] { parse_data_mixture("a:-1"); }, {"weight \"-1\" of a", "positive number"});
  expect_error([] { parse_data_mixture("a:x"); }, {"weight \"x\""});
  expect_error([] { parse_data_mixture(":2"); }, {"names no directory"});
}

// Sources of counting tokens from distinct bases, so a window's first token names its source.
struct Sources {
  std::vector<std::vector<int32_t>> tokens;
  DataMixture mixture;
  Sources(const std::vector<int64_t>& sizes, const std::vector<double>& weights) : tokens(sizes.size()) {
    double total = 0;
    for (const double w : weights) total += w;
    for (size_t i = 0; i < sizes.size(); ++i) {
      tokens[i].resize(sizes[i]);
      std::iota(tokens[i].begin(), tokens[i].end(), static_cast<int32_t>(i * 1000000));
      DataDir dir;
      TokenShard shard;
      shard.tokens = tokens[i];
      dir.train.shards.push_back(shard);
      mixture.dirs.push_back(dir);
      mixture.sources.push_back({"source" + std::to_string(i), weights[i]});
      mixture.weights.push_back(weights[i] / total);
    }
  }
};

std::vector<int32_t> first_tokens(MixtureSampler& sampler, int64_t windows, int64_t seq_len) {
  std::vector<int32_t> inputs(windows * seq_len), targets(windows * seq_len);  // [windows, seq_len]
  sampler.next_batch(inputs.data(), targets.data(), windows);
  std::vector<int32_t> first;
  for (int64_t w = 0; w < windows; ++w) {
    EXPECT_EQ(targets[w * seq_len], inputs[w * seq_len] + 1);
    first.push_back(inputs[w * seq_len]);
  }
  return first;
}

TEST(MixtureSampler, FollowsTheWeightsAndResumesBitwise) {
  const std::vector<double> weights = {0.7, 0.2, 0.1};
  const Sources sources({4001, 20001, 333}, weights);
  MixtureSampler sampler(sources.mixture, 4, 9);
  const int64_t windows = 100000;
  const std::vector<int32_t> first = first_tokens(sampler, windows, 4);
  std::vector<int64_t> counts(3, 0);
  for (const int32_t t : first) ++counts[t / 1000000];
  for (size_t i = 0; i < 3; ++i) {
    const double share = double(counts[i]) / double(windows);
    EXPECT_NEAR(share / weights[i], 1.0, 0.02) << "source " << i << ": " << counts[i] << " windows";
  }
  EXPECT_EQ(sampler.source_positions(), counts);
  EXPECT_EQ(sampler.position(), windows);

  // Restored from a saved state, the sampler hands out the same windows as one that ran on.
  MixtureSampler original(sources.mixture, 4, 9), resumed(sources.mixture, 4, 9);
  first_tokens(original, 1234, 4);
  const int64_t position = original.position();
  const std::vector<int64_t> positions = original.source_positions();
  const std::vector<int32_t> continued = first_tokens(original, 777, 4);
  resumed.set_positions(position, positions);
  EXPECT_EQ(first_tokens(resumed, 777, 4), continued);
  expect_error([&] { resumed.set_positions(position, {1, 2}); }, {"2 source positions for a mixture of 3"});
  expect_error([&] { resumed.set_positions(position + 1, positions); }, {"sum to 1234, not the position 1235"});
}

TEST(MixtureSampler, OneSourceIsThePlainSampler) {
  const Sources sources({5000}, {1.0});
  MixtureSampler mixture(sources.mixture, 7, 3);
  Sampler plain(sources.mixture.dirs[0].train.streams(), 7, 3);
  std::vector<int32_t> a(50 * 7), b(50 * 7), ta(50 * 7), tb(50 * 7);
  mixture.next_batch(a.data(), ta.data(), 50);
  plain.next_batch(b.data(), tb.data(), 50);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ta, tb);
  mixture.set_positions(11, {});
  plain.set_position(11);
  mixture.next_batch(a.data(), ta.data(), 50);
  plain.next_batch(b.data(), tb.data(), 50);
  EXPECT_EQ(a, b);
}

TEST(DataMixture, DirectoriesOfDifferentTokenizersAreRefused) {
  test::ScratchDir dir("mixture_tokenizers");
  for (const auto& [name, seed] : {std::pair{"a", 1}, {"b", 1}, {"c", 2}}) {
    const std::string d = dir.path(name);
    std::filesystem::create_directories(d);
    train_tokenizer(testing::generated_documents(80, seed), 300, d + "/tokenizer.model");
    const uint64_t hash = tokenizer_file_hash(d + "/tokenizer.model");
    write_token_shard(d + "/train.bin", std::vector<int32_t>{5, 6, 7, 1}, 300, hash, 10);
    write_token_shard(d + "/val.bin", std::vector<int32_t>{5, 1}, 300, hash, 4);
  }
  const DataMixture same = open_data_mixture(dir.path("a") + ":3," + dir.path("b") + ":1", 300);
  EXPECT_EQ(same.weights, (std::vector<double>{0.75, 0.25}));
  EXPECT_EQ(same.val_streams().size(), 2u);
  EXPECT_NE(same.train_checksum(), same.dirs[0].train.checksum) << "a mixture's checksum covers every source";
  expect_error([&] { open_data_mixture(dir.path("a") + "," + dir.path("c"), 300); },
               {dir.path("c") + "/tokenizer.model", "a different tokenizer from", dir.path("a")});
}

}  // namespace
}  // namespace trillion
