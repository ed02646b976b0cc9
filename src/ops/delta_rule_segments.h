// Segments and per-segment states of the gated delta rule's inputs (ops/delta_rule.h), shared by
// its recurrent and chunked forms: each batch row is one segment, or fla's cu_seqlens cuts packed
// tokens into them.
// Internal to src/ops/.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "ops/delta_rule.h"

namespace trillion::delta_rule_detail {

// Tokens [begin, end) of batch row `row`.
struct Segment {
  int64_t row = 0, begin = 0, end = 0;
};

inline int64_t segment_count(const int32_t* cu_seqlens, const DeltaRuleSizes& s) {
  return cu_seqlens != nullptr ? s.num_segments : s.batch;
}

inline Segment segment_of(int64_t n, const int32_t* cu_seqlens, const DeltaRuleSizes& s) {
  if (cu_seqlens == nullptr) return {n, 0, s.seq_len};
  return {0, cu_seqlens[n], cu_seqlens[n + 1]};
}

// Checks the sizes and segments; returns the longest segment's length.
inline int64_t check_and_longest_segment(const int32_t* cu_seqlens, const DeltaRuleSizes& s) {
  TRILLION_CHECK(s.batch >= 1 && s.seq_len >= 0 && s.heads >= 1 && s.key_dim >= 1 && s.value_dim >= 1,
                 "delta rule sizes B=", s.batch, " T=", s.seq_len, " H=", s.heads, " K=", s.key_dim,
                 " V=", s.value_dim);
  if (cu_seqlens == nullptr) return s.seq_len;
  TRILLION_CHECK(s.batch == 1, "delta rule with cu_seqlens needs batch 1, got ", s.batch);
  TRILLION_CHECK(s.num_segments >= 1, "delta rule num_segments ", s.num_segments);
  TRILLION_CHECK(cu_seqlens[0] == 0 && cu_seqlens[s.num_segments] == s.seq_len, "delta rule cu_seqlens spans [",
                 cu_seqlens[0], ", ", cu_seqlens[s.num_segments], "), expected [0, ", s.seq_len, ")");
  int64_t longest = 0;
  for (int64_t n = 0; n < s.num_segments; ++n) {
    TRILLION_CHECK(cu_seqlens[n + 1] >= cu_seqlens[n], "delta rule cu_seqlens decreases at ", n);
    longest = std::max<int64_t>(longest, cu_seqlens[n + 1] - cu_seqlens[n]);
  }
  return longest;
}

// S[K, V] ← the state of segment n, head h in src[N, H, K, V], or zeros when src is null.
template <class T>
void load_state(T* S, const T* src, int64_t n, int64_t h, const DeltaRuleSizes& s) {
  const int64_t KV = s.key_dim * s.value_dim;
  if (src != nullptr) {
    std::copy(src + (n * s.heads + h) * KV, src + (n * s.heads + h + 1) * KV, S);
  } else {
    std::fill(S, S + KV, T(0));
  }
}

}  // namespace trillion::delta_rule_detail
