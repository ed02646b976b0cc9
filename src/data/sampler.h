// Training batches from a token stream: seeded, deterministic and resumable.
//
// The stream is cut into windows of seq_len + 1 tokens (stride seq_len; inputs are the first
// seq_len, targets the last seq_len). Each epoch visits every window once in an order given by a
// counter-based permutation of (seed, epoch), so the sampler's whole state is the number of windows
// handed out so far: position() / set_position() save and restore it exactly. The permutation of
// epoch e is a Fisher-Yates shuffle driven by CounterRng(seed, "data.sampler" + e); the current
// epoch's permutation is cached. The sampler keeps a reference to `tokens`, which must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"

namespace trillion {

class Sampler {
 public:
  Sampler(const std::vector<int32_t>& tokens, int64_t seq_len, uint64_t seed);
  int64_t windows_per_epoch() const { return windows_; }
  // Fills inputs[batch, seq_len] and targets[batch, seq_len] with the next `batch` windows.
  void next_batch(int32_t* inputs, int32_t* targets, int64_t batch);
  int64_t position() const { return position_; }
  void set_position(int64_t position) { position_ = position; }

 private:
  int64_t window_at(int64_t position) const;  // start offset of the window handed out at `position`

  const std::vector<int32_t>& tokens_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t windows_;
  int64_t position_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable Buffer<int64_t> permutation_;  // [windows_]: window index handed out at each step of cached_epoch_
};

// Every non-overlapping window of the stream, in order, for evaluation: window w covers tokens
// [w·seq_len, (w+1)·seq_len] (the last partial window is included; its missing targets are
// kIgnoreIndex, its missing inputs 0). Every token after the first is a target exactly once.
// Returns the number of windows, ceil((tokens - 1) / seq_len).
int64_t eval_window_count(const std::vector<int32_t>& tokens, int64_t seq_len);
// Fills inputs[seq_len] and targets[seq_len] with eval window `window` (0 <= window < count).
void eval_window(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t window, int32_t* inputs,
                 int32_t* targets);

}  // namespace trillion
