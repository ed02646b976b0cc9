// The unigram and bigram baselines (data/baselines.h has the formulas).
#include "data/baselines.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace trillion {
namespace {

// The id of a stored token of a split fit on or scored against a vocabulary of `vocab_size`.
int32_t checked_id(int32_t stored, int64_t vocab_size, const char* split) {
  const int32_t id = token_id(stored);
  TRILLION_CHECK(id < vocab_size, split, " token id ", id, " ≥ vocab_size ", vocab_size);
  return id;
}

uint64_t pair_key(int32_t previous, int32_t next) {
  return (static_cast<uint64_t>(previous) << 32) | static_cast<uint32_t>(next);
}

}  // namespace

double unigram_baseline_nats(const TokenStreams& fit, const TokenStreams& eval, int64_t vocab_size) {
  TRILLION_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);  // [V]
  int64_t fit_count = 0, eval_count = 0;
  for (const std::span<const int32_t> stream : fit) {
    for (const int32_t stored : stream) {
      const int32_t id = checked_id(stored, vocab_size, "fit");
      if (!is_target(stored)) continue;
      ++counts[static_cast<size_t>(id)];
      ++fit_count;
    }
  }
  const double log_total = std::log(static_cast<double>(fit_count) + static_cast<double>(vocab_size));
  double nats = 0.0;
  for (const std::span<const int32_t> stream : eval) {
    for (const int32_t stored : stream) {
      const int32_t id = checked_id(stored, vocab_size, "eval");
      if (!is_target(stored)) continue;
      nats += log_total - std::log(static_cast<double>(counts[static_cast<size_t>(id)] + 1));
      ++eval_count;
    }
  }
  TRILLION_CHECK(eval_count > 0, "no eval target tokens");
  return nats / static_cast<double>(eval_count);
}

BigramBaseline::BigramBaseline(const TokenStreams& fit, int64_t vocab_size)
    : vocab_size_(vocab_size),
      context_counts_(static_cast<size_t>(vocab_size), 0),
      context_types_(static_cast<size_t>(vocab_size), 0),
      continuation_types_(static_cast<size_t>(vocab_size), 0) {
  TRILLION_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  for (const std::span<const int32_t> stream : fit) {
    int32_t previous = -1;  // none before the stream's first token
    for (const int32_t stored : stream) {
      const int32_t next = checked_id(stored, vocab_size, "fit");
      if (previous >= 0 && is_target(stored)) {
        ++pair_counts_[pair_key(previous, next)];
        ++context_counts_[static_cast<size_t>(previous)];
      }
      previous = next;
    }
  }
  int64_t once = 0, twice = 0;  // n1, n2
  for (const auto& [key, count] : pair_counts_) {
    ++context_types_[static_cast<size_t>(key >> 32)];
    ++continuation_types_[static_cast<size_t>(key & 0xffffffffu)];
    once += count == 1;
    twice += count == 2;
  }
  pair_types_ = static_cast<int64_t>(pair_counts_.size());
  continued_tokens_ =
      std::count_if(continuation_types_.begin(), continuation_types_.end(), [](int64_t types) { return types > 0; });
  if (once > 0) discount_ = static_cast<double>(once) / static_cast<double>(once + 2 * twice);
}

double BigramBaseline::lower_order(int32_t next) const {
  const double uniform = 1.0 / static_cast<double>(vocab_size_);
  if (pair_types_ == 0) return uniform;
  const double types = static_cast<double>(pair_types_);
  return std::max(static_cast<double>(continuation_types_[static_cast<size_t>(next)]) - discount_, 0.0) / types +
         discount_ * static_cast<double>(continued_tokens_) / types * uniform;
}

double BigramBaseline::probability(int32_t previous, int32_t next) const {
  TRILLION_CHECK(next >= 0 && next < vocab_size_, "token ", next, " outside the vocabulary of ", vocab_size_);
  TRILLION_CHECK(previous < vocab_size_, "token ", previous, " outside the vocabulary of ", vocab_size_);
  const double low = lower_order(next);
  if (previous < 0 || context_counts_[static_cast<size_t>(previous)] == 0) return low;
  const double context = static_cast<double>(context_counts_[static_cast<size_t>(previous)]);
  const auto found = pair_counts_.find(pair_key(previous, next));
  const double pair = found == pair_counts_.end() ? 0.0 : static_cast<double>(found->second);
  return std::max(pair - discount_, 0.0) / context +
         discount_ * static_cast<double>(context_types_[static_cast<size_t>(previous)]) / context * low;
}

double BigramBaseline::cross_entropy(const TokenStreams& eval) const {
  double nats = 0.0;
  int64_t eval_count = 0;
  for (const std::span<const int32_t> stream : eval) {
    int32_t previous = -1;
    for (const int32_t stored : stream) {
      const int32_t id = checked_id(stored, vocab_size_, "eval");
      if (is_target(stored)) {
        nats -= std::log(probability(previous, id));
        ++eval_count;
      }
      previous = id;
    }
  }
  TRILLION_CHECK(eval_count > 0, "no eval target tokens");
  return nats / static_cast<double>(eval_count);
}

double bigram_baseline_nats(const TokenStreams& fit, const TokenStreams& eval, int64_t vocab_size) {
  return BigramBaseline(fit, vocab_size).cross_entropy(eval);
}

}  // namespace trillion
