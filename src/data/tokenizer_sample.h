// TokenizerSample: the text a tokenizer trains on, drawn from a corpus of any size in bounded
// memory, so no document is lost to the trainer's sentence limit and a 1 GB corpus trains in
// bounded time.
//
// Each document is cut into sentences of at most kMaxTrainingSentenceBytes: its lines, a line
// longer than that cut after its last sentence end (". ", "! ", "? ", "。", "！", "？") within the
// limit, else after its last space, else at the last UTF-8 character boundary; consecutive pieces
// are packed into one sentence while they fit (so a document within the limit is one sentence, as
// the trainer saw documents before). Sentence s of the corpus
// (counted in order) gets the key CounterRng(seed, "tokenizer.sample").bits(s); the sample is the
// sentences of smallest key whose bytes fit the budget (a bottom-k sample: it depends only on the
// corpus, the seed and the budget), handed to the trainer in corpus order. Memory: the budget's
// bytes plus about 64 bytes per kept sentence.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace trillion {

constexpr int64_t kMaxTrainingSentenceBytes = 16 << 10;

// The sentences of `text` as defined above (views into it, in order; whitespace-only ones left out).
std::vector<std::string_view> training_sentences(std::string_view text);

class TokenizerSample {
 public:
  TokenizerSample(int64_t budget_bytes, uint64_t seed);
  void add_document(std::string_view document, int64_t document_index);
  // The kept sentences in corpus order, without those of documents where exclude(index) holds
  // (the val split, known only once every document is counted). Empties the sample.
  std::vector<std::string> take(const std::function<bool(int64_t document_index)>& exclude);
  int64_t sentences_seen() const { return sentences_seen_; }
  int64_t bytes_seen() const { return bytes_seen_; }

 private:
  struct Entry {
    uint64_t key = 0;
    int64_t sentence = 0;  // index in the corpus
    int64_t document = 0;
    std::string text;
  };
  static bool key_less(const Entry& a, const Entry& b) { return a.key < b.key; }

  int64_t budget_bytes_;
  uint64_t seed_;
  std::vector<Entry> heap_;  // max-heap by key: the largest key is dropped first
  int64_t kept_bytes_ = 0;
  // The smallest key dropped so far: the kept sentences are those of smaller key, which makes the
  // sample the longest prefix in key order that fits, whatever the order of arrival.
  uint64_t dropped_key_ = UINT64_MAX;
  int64_t sentences_seen_ = 0, bytes_seen_ = 0;
};

}  // namespace trillion
