// The tokenizer's training sample: bounded sentences, bottom-k by a seeded key. See
// tokenizer_sample.h.
#include "data/tokenizer_sample.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "data/corpus.h"

namespace trillion {
namespace {

bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Where to cut `line` (longer than the limit): just after the last sentence end within the limit,
// else after the last space, else at the last character boundary.
size_t cut_point(std::string_view line, size_t limit) {
  const std::string_view head = line.substr(0, limit);
  size_t best = 0;
  for (const std::string_view end : {". ", "! ", "? "}) {
    const size_t at = head.rfind(end);
    if (at != std::string_view::npos) best = std::max(best, at + end.size());
  }
  for (const std::string_view end : {"。", "！", "？"}) {
    const size_t at = head.rfind(end);
    if (at != std::string_view::npos) best = std::max(best, at + end.size());
  }
  if (best == 0) {
    const size_t space = head.rfind(' ');
    if (space != std::string_view::npos) best = space + 1;
  }
  if (best == 0) {
    best = limit;
    while (best > 0 && is_continuation_byte(line[best])) --best;
    if (best == 0) best = limit;  // no boundary in reach: not UTF-8 text, cut anyway
  }
  return best;
}

}  // namespace

std::vector<std::string_view> training_sentences(std::string_view text) {
  const size_t limit = static_cast<size_t>(kMaxTrainingSentenceBytes);
  std::vector<std::string_view> sentences;
  const char* start = text.data();  // of the sentence being packed: pieces are contiguous in `text`
  size_t length = 0;
  const auto add_piece = [&](std::string_view piece) {
    if (length + piece.size() > limit) {
      if (!is_whitespace_only(std::string_view(start, length))) sentences.emplace_back(start, length);
      start = piece.data();
      length = 0;
    }
    length += piece.size();
  };
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline == std::string_view::npos ? text.size() : newline + 1);
    text.remove_prefix(line.size());
    while (line.size() > limit) {
      const size_t cut = cut_point(line, limit);
      add_piece(line.substr(0, cut));
      line.remove_prefix(cut);
    }
    add_piece(line);
  }
  if (length > 0 && !is_whitespace_only(std::string_view(start, length))) sentences.emplace_back(start, length);
  return sentences;
}

TokenizerSample::TokenizerSample(int64_t budget_bytes, uint64_t seed) : budget_bytes_(budget_bytes), seed_(seed) {
  TRILLION_CHECK(budget_bytes > 0, "tokenizer sample budget ", budget_bytes);
}

void TokenizerSample::add_document(std::string_view document, int64_t document_index) {
  const CounterRng rng(seed_, "tokenizer.sample");
  for (const std::string_view sentence : training_sentences(document)) {
    const int64_t index = sentences_seen_++;
    bytes_seen_ += static_cast<int64_t>(sentence.size());
    const uint64_t key = rng.bits(static_cast<uint64_t>(index));
    if (key >= dropped_key_) continue;  // after a dropped sentence in key order: never kept
    heap_.push_back(Entry{key, index, document_index, std::string(sentence)});
    std::push_heap(heap_.begin(), heap_.end(), key_less);
    kept_bytes_ += static_cast<int64_t>(sentence.size());
    while (kept_bytes_ > budget_bytes_) {
      std::pop_heap(heap_.begin(), heap_.end(), key_less);
      dropped_key_ = heap_.back().key;
      kept_bytes_ -= static_cast<int64_t>(heap_.back().text.size());
      heap_.pop_back();
    }
  }
}

std::vector<std::string> TokenizerSample::take(const std::function<bool(int64_t)>& exclude) {
  std::sort(heap_.begin(), heap_.end(), [](const Entry& a, const Entry& b) { return a.sentence < b.sentence; });
  std::vector<std::string> sentences;
  for (Entry& entry : heap_) {
    if (!exclude(entry.document)) sentences.push_back(std::move(entry.text));
  }
  heap_.clear();
  kept_bytes_ = 0;
  return sentences;
}

}  // namespace trillion
