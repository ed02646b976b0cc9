// What a language model must beat on a split, fit on another split's tokens (the train split's,
// scored on the val split): the add-one-smoothed unigram model and the interpolated Kneser-Ney
// bigram model. `trillion eval` prints both beside the model's validation loss
// (docs/validation.md). Both fit and score the target tokens (shards.h is_target: every token of
// plain text, the answers of conversations), in nats per token, the bigram model after any token;
// a stream's first token, with no token before it, is scored by the bigram model's lower order.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "data/shards.h"

namespace trillion {

// Cross-entropy (nats/token) of the `eval` targets under the add-one-smoothed unigram distribution
// of the `fit` targets.
double unigram_baseline_nats(const TokenStreams& fit, const TokenStreams& eval, int64_t vocab_size);

// The interpolated Kneser-Ney bigram model (Chen & Goodman 1998, one discount D = n1 / (n1 + 2 n2)
// from the counts of bigram types seen once and twice), over the bigrams inside each fit stream
// whose second token is a target:
//   P(w | v) = max(c(v w) − D, 0) / c(v ·) + D · N1+(v ·) / c(v ·) · P_low(w)      (c(v ·) > 0)
//   P(w | v) = P_low(w)                                                           (otherwise)
//   P_low(w) = max(N1+(· w) − D, 0) / N1+(· ·) + D · T / N1+(· ·) / V
// where c counts bigrams, N1+ counts distinct bigram types (N1+(· w): distinct tokens before w),
// T the tokens with N1+(· w) > 0 and V the vocabulary. Every P(· | v) sums to 1 over the vocabulary
// and gives every token some mass; no fit bigram at all gives the uniform 1 / V.
class BigramBaseline {
 public:
  BigramBaseline(const TokenStreams& fit, int64_t vocab_size);
  // P(next | previous); previous < 0: no token before (the lower order).
  double probability(int32_t previous, int32_t next) const;
  // Cross-entropy (nats/token) of the targets of `eval`.
  double cross_entropy(const TokenStreams& eval) const;
  double discount() const { return discount_; }

 private:
  double lower_order(int32_t next) const;
  int64_t vocab_size_;
  double discount_ = 0.5;                              // D (0.5 while the fit has no bigram seen once)
  std::unordered_map<uint64_t, int64_t> pair_counts_;  // c(v w), keyed v · 2^32 + w
  std::vector<int64_t> context_counts_;                // [V] c(v ·)
  std::vector<int64_t> context_types_;                 // [V] N1+(v ·)
  std::vector<int64_t> continuation_types_;            // [V] N1+(· w)
  int64_t pair_types_ = 0;                             // N1+(· ·)
  int64_t continued_tokens_ = 0;                       // T
};

// BigramBaseline(fit, vocab_size).cross_entropy(eval).
double bigram_baseline_nats(const TokenStreams& fit, const TokenStreams& eval, int64_t vocab_size);

}  // namespace trillion
