// The tokenizer's training sample: sentences are bounded, cut where tokenize's rules say, packed
// while they fit, and together are the text (a short document is one sentence); the sample is the bottom-k by key that fits
// the budget (checked against a brute-force selection), in corpus order, and without the excluded
// documents.
#include "data/tokenizer_sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/corpus.h"
#include "data/data_test_util.h"

namespace trillion {
namespace {

std::string joined(const std::vector<std::string_view>& pieces) {
  std::string text;
  for (const std::string_view piece : pieces) text += piece;
  return text;
}

TEST(TrainingSentences, AreBoundedAndCutAtSentenceEndsSpacesOrCharacters) {
  const size_t limit = kMaxTrainingSentenceBytes;
  const std::string words = [&] {
    std::string text;
    while (text.size() < 3 * limit) text += "word ";
    return text;
  }();
  const std::string sentences = [&] {
    std::string text;
    while (text.size() < 3 * limit) text += "A short sentence. ";
    return text;
  }();
  const std::string cjk = [&] {  // three-byte characters, no spaces
    std::string text;
    while (text.size() < 3 * limit) text += "日本語";
    return text;
  }();
  const std::string text = "line one\n  \nline two\n" + words + "\n" + sentences + "\n" + cjk;
  const std::vector<std::string_view> cut = training_sentences(text);
  for (const std::string_view s : cut) {
    EXPECT_LE(s.size(), limit);
    EXPECT_EQ(invalid_utf8_offset(s), std::string_view::npos) << "cut inside a character";
  }
  EXPECT_EQ(joined(cut), text);
  EXPECT_EQ(cut[0], "line one\n  \nline two\n") << "short lines packed while they fit";
  EXPECT_EQ(cut[1].back(), ' ') << "a line of words is cut after a space";
  const auto first_sentence_piece = std::find_if(cut.begin(), cut.end(), [](std::string_view s) { return s[0] == 'A'; });
  ASSERT_NE(first_sentence_piece, cut.end());
  EXPECT_EQ(first_sentence_piece->substr(first_sentence_piece->size() - 2), ". ") << "cut after a sentence end";
  EXPECT_EQ(training_sentences("a short\n\ndocument\n"), (std::vector<std::string_view>{"a short\n\ndocument\n"}));
  EXPECT_TRUE(training_sentences(" \n\t\n").empty());
}

// The kept sentences must be, among all sentences in key order, the longest prefix that fits.
TEST(TokenizerSample, IsTheBottomKByKeyThatFitsTheBudget) {
  const std::vector<std::string> documents = testing::generated_documents(300, 17);
  const int64_t budget = 5000;
  TokenizerSample sample(budget, 5);
  for (size_t d = 0; d < documents.size(); ++d) sample.add_document(documents[d], static_cast<int64_t>(d));
  struct Sentence {
    uint64_t key;
    int64_t index, document;
    std::string text;
  };
  std::vector<Sentence> all;
  const CounterRng rng(5, "tokenizer.sample");
  for (size_t d = 0; d < documents.size(); ++d) {
    for (const std::string_view s : training_sentences(documents[d])) {
      const int64_t index = static_cast<int64_t>(all.size());
      all.push_back({rng.bits(static_cast<uint64_t>(index)), index, static_cast<int64_t>(d), std::string(s)});
    }
  }
  EXPECT_EQ(sample.sentences_seen(), static_cast<int64_t>(all.size()));
  std::vector<Sentence> by_key = all;
  std::sort(by_key.begin(), by_key.end(), [](const Sentence& a, const Sentence& b) { return a.key < b.key; });
  std::vector<int64_t> kept;
  int64_t bytes = 0;
  for (const Sentence& s : by_key) {
    if (bytes + static_cast<int64_t>(s.text.size()) > budget) break;
    bytes += static_cast<int64_t>(s.text.size());
    if (s.document % 3 != 0) kept.push_back(s.index);  // documents 0, 3, 6, … excluded
  }
  std::sort(kept.begin(), kept.end());
  std::vector<std::string> expected;
  for (const int64_t index : kept) expected.push_back(all[index].text);
  const std::vector<std::string> taken = sample.take([](int64_t d) { return d % 3 == 0; });
  EXPECT_EQ(taken, expected);
  EXPECT_GT(taken.size(), 10u);
  EXPECT_LT(taken.size(), all.size() / 2) << "the budget bounds the sample";
}

}  // namespace
}  // namespace trillion
