// Training windows in a seeded, resumable order (Sampler) and the in-order evaluation windows.
#include "data/sampler.h"

#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cross_entropy.h"

namespace trillion {

Sampler::Sampler(const std::vector<int32_t>& tokens, int64_t seq_len, uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), seed_(seed) {
  if (seq_len <= 0) fail("sampler: seq_len ", seq_len, " must be positive");
  windows_ = (static_cast<int64_t>(tokens.size()) - 1) / seq_len;
  if (windows_ <= 0)
    fail("training data has ", tokens.size(), " tokens, fewer than one window of seq_len + 1 = ", seq_len + 1);
}

int64_t Sampler::window_at(int64_t position) const {
  TRILLION_CHECK(position >= 0, "sampler position ", position);
  const int64_t epoch = position / windows_;
  if (epoch != cached_epoch_) {
    if (permutation_.size() != windows_) permutation_ = Buffer<int64_t>(windows_);
    for (int64_t i = 0; i < windows_; ++i) permutation_[i] = i;
    const CounterRng rng(seed_, hash_name("data.sampler") + static_cast<uint64_t>(epoch));
    for (int64_t i = windows_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[i], permutation_[j]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[position % windows_] * seq_len_;
}

void Sampler::next_batch(int32_t* inputs, int32_t* targets, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* window = tokens_.data() + window_at(position_++);  // [seq_len + 1]
    for (int64_t t = 0; t < seq_len_; ++t) {
      inputs[b * seq_len_ + t] = window[t];
      targets[b * seq_len_ + t] = window[t + 1];
    }
  }
}

int64_t eval_window_count(const std::vector<int32_t>& tokens, int64_t seq_len) {
  TRILLION_CHECK(seq_len > 0, "seq_len ", seq_len);
  const int64_t targets = static_cast<int64_t>(tokens.size()) - 1;
  return targets <= 0 ? 0 : (targets + seq_len - 1) / seq_len;
}

void eval_window(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t window, int32_t* inputs,
                 int32_t* targets) {
  TRILLION_CHECK(window >= 0 && window < eval_window_count(tokens, seq_len), "eval window ", window);
  const int64_t count = static_cast<int64_t>(tokens.size());
  const int64_t start = window * seq_len;
  for (int64_t t = 0; t < seq_len; ++t) {
    const int64_t i = start + t;
    inputs[t] = i < count ? tokens[static_cast<size_t>(i)] : 0;
    targets[t] = i + 1 < count ? tokens[static_cast<size_t>(i + 1)] : kIgnoreIndex;
  }
}

}  // namespace trillion
