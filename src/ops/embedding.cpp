// Token embedding lookup and its backward. The backward groups token positions by id with a stable
// counting sort, then each vocabulary row sums its positions in token order: no two threads write
// the same row, and the summation order depends on the tokens alone, not on the thread count.
#include "ops/embedding.h"

#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

void check_tokens(const int32_t* tokens, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    TRILLION_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "token id ", tokens[i], " at position ", i,
                   " outside [0, ", vocab, ")");
}

}  // namespace

template <class T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t n, int64_t d, int64_t vocab) {
  PhaseScope scope(Phase::elementwise);
  check_tokens(tokens, n, vocab);
  // out[n, d] ← table[vocab, d] rows
  parallel_for(n, d, [&](int64_t i) {
    std::memcpy(out + i * d, table + static_cast<int64_t>(tokens[i]) * d, static_cast<size_t>(d) * sizeof(T));
  });
}

template <class T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t n, int64_t d, int64_t vocab) {
  PhaseScope scope(Phase::elementwise);
  check_tokens(tokens, n, vocab);
  // Stable counting sort of positions by token id: positions of id v are
  // order[first[v] .. first[v + 1]) in increasing position.
  Buffer<int64_t> first(vocab + 1);  // [vocab + 1]
  Buffer<int64_t> order(n);          // [n]
  for (int64_t i = 0; i < n; ++i) ++first[tokens[i] + 1];
  for (int64_t v = 0; v < vocab; ++v) first[v + 1] += first[v];
  {
    Buffer<int64_t> next(vocab);  // [vocab] next free slot per id
    std::memcpy(next.data(), first.data(), static_cast<size_t>(vocab) * sizeof(int64_t));
    for (int64_t i = 0; i < n; ++i) order[next[tokens[i]]++] = i;
  }
  // dtable[v, :] += Σ dout[i, :] over the positions of v, in position order.
  parallel_for_dynamic(vocab, [&](int64_t v) {
    if (first[v] == first[v + 1]) return;
    T* row = dtable + v * d;
    for (int64_t s = first[v]; s < first[v + 1]; ++s) {
      const T* grad = dout + order[s] * d;
      for (int64_t j = 0; j < d; ++j) row[j] += grad[j];
    }
  });
}

#define TRILLION_INSTANTIATE_EMBEDDING(T)                                                             \
  template void embedding_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t); \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);
TRILLION_INSTANTIATE_EMBEDDING(float)
TRILLION_INSTANTIATE_EMBEDDING(double)
#undef TRILLION_INSTANTIATE_EMBEDDING

}  // namespace trillion
