// Training batches from a token stream: seeded, deterministic and resumable.
//
// Stored ids carry the loss mask (data/shards.h): inputs are token_id, targets of tokens that are
// not targets are kIgnoreIndex. Each stream (a split's shard) is cut into windows of seq_len + 1 tokens (stride seq_len; inputs
// are the first seq_len, targets the last seq_len; no window crosses a stream's end), numbered
// stream after stream. Each epoch visits every window once in an order given by a
// counter-based permutation of (seed, epoch), so the sampler's whole state is the number of windows
// handed out so far: position() / set_position() save and restore it exactly. The permutation of
// epoch e is a Fisher-Yates shuffle driven by CounterRng(seed, "data.sampler" + e); the current
// epoch's permutation is cached. The streams' memory (a split's mappings) must outlive the sampler.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "data/shards.h"

namespace trillion {

class Sampler {
 public:
  Sampler(TokenStreams streams, int64_t seq_len, uint64_t seed);
  int64_t windows_per_epoch() const { return windows_; }
  // Fills inputs[batch, seq_len] and targets[batch, seq_len] with the next `batch` windows.
  void next_batch(int32_t* inputs, int32_t* targets, int64_t batch);
  int64_t position() const { return position_; }
  void set_position(int64_t position) { position_ = position; }

 private:
  const int32_t* window_at(int64_t position) const;  // the window handed out at `position`

  TokenStreams streams_;
  std::vector<int64_t> first_window_;  // [streams + 1] the number of the first window of each stream
  int64_t seq_len_;
  uint64_t seed_;
  int64_t windows_;
  int64_t position_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable Buffer<int64_t> permutation_;  // [windows_]: window index handed out at each step of cached_epoch_
};

// Every non-overlapping window of each stream, in order, for evaluation: window w of a stream
// covers its tokens [w·seq_len, (w+1)·seq_len] (the last partial window is included; its missing
// targets are kIgnoreIndex, its missing inputs 0). Every token of a stream after its first is a
// target exactly once. A stream of n tokens has ceil((n - 1) / seq_len) windows.
int64_t eval_window_count(const TokenStreams& streams, int64_t seq_len);
int64_t eval_target_count(const TokenStreams& streams);  // the targets of all windows: Σ (n − 1) unmasked
// Fills inputs[seq_len] and targets[seq_len] with eval window `window` (0 <= window < count),
// counting windows stream after stream.
void eval_window(const TokenStreams& streams, int64_t seq_len, int64_t window, int32_t* inputs, int32_t* targets);

}  // namespace trillion
