// Context parallelism (parallel/context_parallel.h, context_delta_rule.h, context_conv1d.h): the
// causally balanced split, and attention (GQA; also sparse over the lightning indexer's top-k; MLA
// absorbed over the gathered latent rows, dense and sparse, against one rank's expanded form), the
// gated delta rule (per-head and per-key-channel decay) and the short convolution (its halo from
// the chunks before) split over 1 to 4 ranks under mpirun (`trillion bench context-parallel` at a
// tiny size, in double) equal to one rank's over the whole sequence to 1e-10 in the outputs and
// every gradient, with sequence lengths no multiple of 2 · cp, a value head dim of its own, and
// document masks crossing the ranks' chunks or starting at them; the bytes each rank receives are
// the formula's exactly.
#include "parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/cli_fixture.h"

namespace trillion {
namespace {

// The causal work of a rank: Σ over its tokens of the keys each sees (position + 1).
int64_t causal_work(const ContextSplit& split, int rank) {
  int64_t work = 0;
  for (const int32_t p : split.positions(rank)) work += p + 1;
  return work;
}

TEST(ContextSplit, ChunksCoverTheSequenceInOrderAndBalanceTheCausalWork) {
  for (const int cp : {1, 2, 3, 4, 8})
    for (const int64_t seq : {int64_t(2 * cp), int64_t(64), int64_t(203), int64_t(1000)}) {
      if (seq < 2 * cp) continue;
      SCOPED_TRACE(testing::Message() << "cp " << cp << ", seq " << seq);
      const ContextSplit split(seq, cp);
      int64_t end = 0, shortest = seq, longest = 0;
      for (int c = 0; c < 2 * cp; ++c) {
        const ContextSplit::Span chunk = split.chunk(c);
        EXPECT_EQ(chunk.begin, end);
        end = chunk.end;
        shortest = std::min(shortest, chunk.size());
        longest = std::max(longest, chunk.size());
      }
      EXPECT_EQ(end, seq);
      EXPECT_LE(longest - shortest, 1);
      std::vector<int> held(seq, 0);  // how many ranks hold each position
      int64_t least = causal_work(split, 0), most = least;
      for (int r = 0; r < cp; ++r) {
        const std::vector<int32_t> positions = split.positions(r);
        EXPECT_EQ(int64_t(positions.size()), split.local_len(r));
        const std::array<ContextSplit::Span, 2> spans = split.spans(r);
        EXPECT_EQ(positions.front(), spans[0].begin);
        EXPECT_EQ(positions.back(), spans[1].end - 1);
        for (const int32_t p : positions) ++held[p];
        least = std::min(least, causal_work(split, r));
        most = std::max(most, causal_work(split, r));
      }
      for (int64_t p = 0; p < seq; ++p) EXPECT_EQ(held[p], 1) << "position " << p;
      // Equal chunks give every rank the same work; one token more in a chunk adds at most seq.
      if (seq % (2 * cp) == 0) {
        EXPECT_EQ(least, most);
      }
      EXPECT_LE(most - least, 2 * seq);
    }
}

TEST(ContextSplit, ASequenceShorterThanTwoChunksPerRankIsRefused) {
  try {
    ContextSplit(7, 4, "--seq-len");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len 7 is too short for --cp 4"), std::string::npos) << e.what();
  }
}

struct Case {
  int ranks;
  std::string flags;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.ranks << " ranks: " << c.flags; }

class ContextMixer : public testing::TestWithParam<Case> {};

TEST_P(ContextMixer, EqualsOneRankOverTheWholeSequence) {
  const Case& c = GetParam();
  const std::string launcher = c.ranks == 1 ? "OMP_NUM_THREADS=1" : train_test::mpirun_launcher(c.ranks);
  const test::CommandResult r = test::run_shell(
      launcher + " " + TRILLION_BINARY + " bench context-parallel --json --dtype double --runs 1 " + c.flags + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json s = nlohmann::json::parse(r.output.substr(r.output.rfind("\n{\"") + 1));
  EXPECT_EQ(s.at("cp").get<int>(), c.ranks);
  EXPECT_LE(s.at("max_rel_err").get<double>(), 1e-10) << r.output;
  EXPECT_TRUE(s.at("traffic_matches_plan").get<bool>()) << r.output;
  // One rank receives nothing; more receive in both passes.
  EXPECT_EQ(s.at("forward_received_bytes").get<int64_t>() > 0, c.ranks > 1);
  EXPECT_EQ(s.at("backward_received_bytes").get<int64_t>() > 0, c.ranks > 1);
}

// 203 tokens: no multiple of 2 · cp for cp 2, 3, 4. Documents of 37 tokens, shifted per sequence,
// cross the chunks; of 51 tokens they start at the chunks' starts (cp 2: 51, 102, 153) in the first.
const std::string kShape = "--seq-len 203 --batch 2 --heads 4 --kv-heads 2 --head-dim 16 --v-dim 8";
const std::string kDelta = "--seq-len 203 --batch 2 --heads 2 --head-dim 16 --v-dim 8 --mixer ";
const std::string kConv = "--batch 2 --heads 3 --head-dim 4 --mixer conv ";  // 12 channels, 4 taps
// MLA's attention between its projections, absorbed over the gathered latent rows (against one
// rank's expanded form), nope, rope, v and the latent of their own sizes; also with a rank-3 adapter
// on kv_b_proj, whose rows widen by its rank.
const std::string kMla =
    "--seq-len 203 --batch 2 --heads 3 --head-dim 16 --rope-dim 8 --v-dim 12 --latent-dim 24 --mixer mla";
// The same over the indexer's top-17 (DeepSeek-V3.2's sparse MLA).
const std::string kSparseMla =
    kMla.substr(0, kMla.find("--mixer")) + "--mixer sparse_mla --index-heads 2 --index-dim 8 --topk 17";
// Sparse attention over the indexer's top-17 of up to 203 keys (fewer early: −1 padded).
const std::string kSparse = kShape + " --mixer sparse --index-heads 2 --index-dim 8 --topk 17";
INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextMixer,
    testing::Values(Case{1, kShape + " --doc-len 37"}, Case{2, kShape + " --doc-len 37"},
                    Case{3, kShape + " --doc-len 37"}, Case{4, kShape + " --doc-len 37"}, Case{4, kShape},
                    Case{2, kShape + " --doc-len 51"},
                    Case{2, "--seq-len 64 --batch 1 --heads 2 --kv-heads 2 --head-dim 8"},
                    Case{1, kDelta + "gated_deltanet"}, Case{2, kDelta + "gated_deltanet --doc-len 51"},
                    Case{3, kDelta + "gated_deltanet --doc-len 37"}, Case{4, kDelta + "gated_deltanet --doc-len 37"},
                    Case{4, kDelta + "gated_deltanet"}, Case{2, kDelta + "kda --doc-len 37"}, Case{3, kDelta + "kda"},
                    Case{4, kDelta + "kda --doc-len 37"}, Case{2, "--seq-len 203 " + kConv + "--doc-len 51"},
                    Case{3, "--seq-len 203 " + kConv + "--doc-len 37"}, Case{4, "--seq-len 203 " + kConv},
                    // Chunks of 2 or 3 tokens: a halo of 6 reaches over several chunks and ranks.
                    Case{4, "--seq-len 19 " + kConv + "--conv-width 7"},
                    Case{4, "--seq-len 19 " + kConv + "--conv-width 7 --doc-len 5"}, Case{1, kSparse + " --doc-len 37"},
                    Case{2, kSparse + " --doc-len 51"}, Case{3, kSparse + " --doc-len 37"}, Case{4, kSparse},
                    Case{4, kSparse + " --doc-len 37"}, Case{1, kMla + " --doc-len 37 --adapter-rank 3"},
                    Case{2, kMla + " --doc-len 51"}, Case{3, kMla + " --doc-len 37 --adapter-rank 3"}, Case{4, kMla},
                    Case{4, kMla + " --doc-len 37 --adapter-rank 3"}, Case{1, kSparseMla + " --doc-len 37"},
                    Case{2, kSparseMla + " --doc-len 51 --adapter-rank 3"},
                    Case{4, kSparseMla + " --doc-len 37 --adapter-rank 3"},
                    // Chunks of 2 or 3 tokens, each selecting over every earlier one.
                    Case{4,
                         "--seq-len 19 --batch 2 --heads 2 --kv-heads 1 --head-dim 8 --mixer sparse "
                         "--index-heads 2 --index-dim 4 --topk 5 --doc-len 5"}),
    [](const testing::TestParamInfo<Case>& info) {
      const std::string& flags = info.param.flags;
      const size_t mixer = flags.find("--mixer ");
      return (mixer == std::string::npos ? std::string("attention")
                                         : flags.substr(mixer + 8, flags.find(' ', mixer + 8) - mixer - 8)) +
             "_" + std::to_string(info.param.ranks) + "ranks" +
             (flags.find("--doc-len") != std::string::npos ? "_documents" : "") + "_" + std::to_string(info.index);
    });

}  // namespace
}  // namespace trillion
