// The training sampler (seeded, every window once per epoch, exact resume, windows inside one
// shard's stream) and the evaluation windows (cover each stream in order, ignored tail).
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data/data_test_util.h"
#include "ops/cross_entropy.h"

namespace trillion {
namespace {

// tokens[i] = i, so a window's first input is its start offset.
std::vector<int32_t> counting_tokens(int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

// Start offsets of the next `windows` windows, checking targets are inputs shifted by one.
std::vector<int32_t> next_starts(Sampler& sampler, int64_t seq_len, int64_t windows) {
  std::vector<int32_t> inputs(static_cast<size_t>(windows * seq_len)), targets(inputs.size());  // [windows, seq_len]
  sampler.next_batch(inputs.data(), targets.data(), windows);
  std::vector<int32_t> starts;
  for (int64_t w = 0; w < windows; ++w) {
    for (int64_t t = 0; t < seq_len; ++t) {
      EXPECT_EQ(inputs[w * seq_len + t], inputs[w * seq_len] + t);
      EXPECT_EQ(targets[w * seq_len + t], inputs[w * seq_len + t] + 1);
    }
    starts.push_back(inputs[w * seq_len]);
  }
  return starts;
}

TEST(Sampler, VisitsEveryWindowOncePerEpochInASeededOrder) {
  const std::vector<int32_t> tokens = counting_tokens(7 * 37 + 5);  // 37 full windows of 7 + 1, 4 tokens left over
  Sampler sampler({tokens}, 7, 11);
  ASSERT_EQ(sampler.windows_per_epoch(), 37);
  std::vector<int32_t> expected(37);
  for (int w = 0; w < 37; ++w) expected[w] = 7 * w;
  std::vector<int32_t> previous;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int32_t> starts = next_starts(sampler, 7, 37);
    EXPECT_NE(starts, expected) << "epoch " << epoch << " is not shuffled";
    EXPECT_NE(starts, previous) << "epoch " << epoch << " repeats the previous order";
    previous = starts;
    std::sort(starts.begin(), starts.end());
    EXPECT_EQ(starts, expected) << "epoch " << epoch;
  }
  EXPECT_EQ(sampler.position(), 3 * 37);
}

TEST(Sampler, SameSeedSameBatchesOtherSeedOtherOrder) {
  const std::vector<int32_t> tokens = counting_tokens(1000);
  Sampler a({tokens}, 16, 5), b({tokens}, 16, 5), c({tokens}, 16, 6);
  const std::vector<int32_t> from_a = next_starts(a, 16, 100);
  EXPECT_EQ(from_a, next_starts(b, 16, 100));
  EXPECT_NE(from_a, next_starts(c, 16, 100));
}

TEST(Sampler, ResumesExactlyFromASavedPosition) {
  const std::vector<int32_t> tokens = counting_tokens(200);
  Sampler original({tokens}, 9, 3);  // 22 windows per epoch
  next_starts(original, 9, 4 * 5);
  const int64_t saved = original.position();
  const std::vector<int32_t> continued = next_starts(original, 9, 3 * 5);  // crosses into epoch 1

  Sampler resumed({tokens}, 9, 3);
  resumed.set_position(saved);
  EXPECT_EQ(next_starts(resumed, 9, 3 * 5), continued);
  // Rewinding a sampler whose cache holds a later epoch gives the same windows too.
  resumed.set_position(saved);
  EXPECT_EQ(next_starts(resumed, 9, 3 * 5), continued);
}

// A split of several shards: each window lies inside one stream; every window of every stream
// once per epoch.
TEST(Sampler, WindowsOfSeveralStreamsNeverCrossAStreamEnd) {
  const std::vector<int32_t> first = counting_tokens(7 * 5 + 3);  // 5 windows, 2 tokens left over
  std::vector<int32_t> second = counting_tokens(7 * 4 + 1);       // 4 windows, exactly
  for (int32_t& t : second) t += 1000;
  Sampler sampler({first, second}, 7, 2);
  ASSERT_EQ(sampler.windows_per_epoch(), 9);
  std::vector<int32_t> starts = next_starts(sampler, 7, 9);  // checks each window is consecutive tokens
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 7, 14, 21, 28, 1000, 1007, 1014, 1021}));
}

// Untargeted tokens (bit 31) are inputs with their ids, and their targets are ignored.
TEST(Sampler, UntargetedTokensAreInputsWithIgnoredTargets) {
  const std::vector<int32_t> stored = {4, static_cast<int32_t>(5 | kNotTargetBit), 6, 7, 8};
  Sampler sampler({stored}, 4, 1);
  std::vector<int32_t> inputs(4), targets(4);
  sampler.next_batch(inputs.data(), targets.data(), 1);
  EXPECT_EQ(inputs, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(targets, (std::vector<int32_t>{kIgnoreIndex, 6, 7, 8}));
  eval_window({stored}, 4, 0, inputs.data(), targets.data());
  EXPECT_EQ(inputs, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(targets, (std::vector<int32_t>{kIgnoreIndex, 6, 7, 8}));
  EXPECT_EQ(eval_target_count({stored}), 3);
}

TEST(Sampler, TooFewTokensIsAnError) {
  const std::vector<int32_t> tokens = counting_tokens(8);
  testing::expect_error([&] { Sampler sampler({tokens}, 8, 1); }, {"8 tokens", "seq_len + 1 = 9"});
  EXPECT_EQ(Sampler({tokens}, 7, 1).windows_per_epoch(), 1);
}

TEST(EvalWindows, CoverEveryTargetOnceInOrderWithIgnoredTail) {
  for (const int64_t count : {23, 21, 2}) {
    const std::vector<int32_t> tokens = counting_tokens(count);
    const int64_t seq_len = 5;
    const int64_t windows = eval_window_count({tokens}, seq_len);
    EXPECT_EQ(windows, (count - 1 + seq_len - 1) / seq_len);
    std::vector<int32_t> targets_seen;
    int64_t ignored = 0;
    for (int64_t w = 0; w < windows; ++w) {
      std::vector<int32_t> inputs(seq_len), targets(seq_len);  // [seq_len]
      eval_window({tokens}, seq_len, w, inputs.data(), targets.data());
      for (int64_t t = 0; t < seq_len; ++t) {
        if (targets[t] == kIgnoreIndex) {
          ++ignored;
          continue;
        }
        EXPECT_EQ(ignored, 0) << "an ignored target before a counted one";
        EXPECT_EQ(inputs[t], w * seq_len + t);
        EXPECT_EQ(targets[t], inputs[t] + 1);
        targets_seen.push_back(targets[t]);
      }
    }
    std::vector<int32_t> expected(static_cast<size_t>(count - 1));
    std::iota(expected.begin(), expected.end(), 1);
    EXPECT_EQ(targets_seen, expected) << count << " tokens";
    EXPECT_EQ(ignored, windows * seq_len - (count - 1));
  }
  EXPECT_EQ(eval_window_count({counting_tokens(1)}, 5), 0);
}

TEST(EvalWindows, CoverEachStreamOnItsOwn) {
  const std::vector<int32_t> first = counting_tokens(23), second = counting_tokens(2);
  const TokenStreams streams = {first, second};
  ASSERT_EQ(eval_window_count(streams, 5), 5 + 1);
  EXPECT_EQ(eval_target_count(streams), 22 + 1);
  std::vector<int32_t> inputs(5), targets(5);  // [seq_len]
  eval_window(streams, 5, 4, inputs.data(), targets.data());  // the first stream's partial last window
  EXPECT_EQ(inputs, (std::vector<int32_t>{20, 21, 22, 0, 0}));
  EXPECT_EQ(targets, (std::vector<int32_t>{21, 22, kIgnoreIndex, kIgnoreIndex, kIgnoreIndex}));
  eval_window(streams, 5, 5, inputs.data(), targets.data());  // the second stream starts afresh
  EXPECT_EQ(inputs, (std::vector<int32_t>{0, 1, 0, 0, 0}));
  EXPECT_EQ(targets, (std::vector<int32_t>{1, kIgnoreIndex, kIgnoreIndex, kIgnoreIndex, kIgnoreIndex}));
}

}  // namespace
}  // namespace trillion
