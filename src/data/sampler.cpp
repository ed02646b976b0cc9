// Training windows in a seeded, resumable order (Sampler) and the in-order evaluation windows.
#include "data/sampler.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cross_entropy.h"

namespace trillion {

Sampler::Sampler(TokenStreams streams, int64_t seq_len, uint64_t seed)
    : streams_(std::move(streams)), seq_len_(seq_len), seed_(seed) {
  if (seq_len <= 0) fail("sampler: seq_len ", seq_len, " must be positive");
  first_window_.push_back(0);
  int64_t tokens = 0;
  for (const std::span<const int32_t> stream : streams_) {
    first_window_.push_back(first_window_.back() + std::max<int64_t>(static_cast<int64_t>(stream.size()) - 1, 0) / seq_len);
    tokens += static_cast<int64_t>(stream.size());
  }
  windows_ = first_window_.back();
  if (windows_ <= 0)
    fail("training data has ", tokens, " tokens, fewer than one window of seq_len + 1 = ", seq_len + 1, " in a shard");
}

const int32_t* Sampler::window_at(int64_t position) const {
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
  const int64_t window = permutation_[position % windows_];
  const size_t stream = static_cast<size_t>(
      std::upper_bound(first_window_.begin(), first_window_.end(), window) - first_window_.begin() - 1);
  return streams_[stream].data() + (window - first_window_[stream]) * seq_len_;
}

void Sampler::next_batch(int32_t* inputs, int32_t* targets, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* window = window_at(position_++);  // [seq_len + 1]
    for (int64_t t = 0; t < seq_len_; ++t) {
      inputs[b * seq_len_ + t] = token_id(window[t]);
      targets[b * seq_len_ + t] = is_target(window[t + 1]) ? window[t + 1] : kIgnoreIndex;
    }
  }
}

namespace {

int64_t windows_of(int64_t tokens, int64_t seq_len) { return tokens <= 1 ? 0 : (tokens - 1 + seq_len - 1) / seq_len; }

}  // namespace

int64_t eval_window_count(const TokenStreams& streams, int64_t seq_len) {
  TRILLION_CHECK(seq_len > 0, "seq_len ", seq_len);
  int64_t windows = 0;
  for (const std::span<const int32_t> stream : streams) windows += windows_of(static_cast<int64_t>(stream.size()), seq_len);
  return windows;
}

int64_t eval_target_count(const TokenStreams& streams) {
  int64_t targets = 0;
  for (const std::span<const int32_t> stream : streams) {
    for (size_t i = 1; i < stream.size(); ++i) targets += is_target(stream[i]) ? 1 : 0;
  }
  return targets;
}

void eval_window(const TokenStreams& streams, int64_t seq_len, int64_t window, int32_t* inputs, int32_t* targets) {
  TRILLION_CHECK(window >= 0, "eval window ", window);
  for (const std::span<const int32_t> stream : streams) {
    const int64_t count = static_cast<int64_t>(stream.size()), windows = windows_of(count, seq_len);
    if (window >= windows) {
      window -= windows;
      continue;
    }
    const int64_t start = window * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t i = start + t;
      inputs[t] = i < count ? token_id(stream[static_cast<size_t>(i)]) : 0;
      const int32_t next = i + 1 < count ? stream[static_cast<size_t>(i + 1)] : kIgnoreIndex;
      targets[t] = i + 1 < count && is_target(next) ? next : kIgnoreIndex;
    }
    return;
  }
  TRILLION_CHECK(false, "eval window past the last stream");
}

}  // namespace trillion
