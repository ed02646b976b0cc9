// Token embedding lookup. Saves nothing (the token ids are the caller's).
// Gradient rule: dtable accumulates (+=); the sum over repeated tokens runs in token order, so the
// result does not depend on the thread count.
#pragma once

#include <cstdint>

namespace trillion {

// out[n, d] = table[tokens[i], :]   (table [vocab, d]; every token id must be in [0, vocab))
template <class T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t n, int64_t d, int64_t vocab);

// dtable[v, :] += Σ_{i: tokens[i] = v} dout[i, :]
template <class T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t n, int64_t d, int64_t vocab);
// The bytes of embedding_backward's temporaries (its counting sort), for the memory plan.
inline int64_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab) {
  return (2 * vocab + 1 + n) * int64_t(sizeof(int64_t));
}

}  // namespace trillion
