// Sparse attention over a per-query selected key set (DeepSeek-V3.2's DSA after the lightning
// indexer): query t attends only to the keys indices[b, t, 0..count_t) with an online softmax, all
// query heads of t sharing that one selection. Query/key head dim (qk_dim) and value head dim
// (v_dim) may differ (MLA: 192 and 128). Never a [q_len, kv_len] matrix: per query, the selected
// keys' rows are read tile by tile.
//
// Layouts (row-major, one sequence per batch entry):
//   q, dq: [batch, q_len, q_heads, qk_dim]        k, dk: [batch, kv_len, kv_heads, qk_dim]
//   v, dv: [batch, kv_len, kv_heads, v_dim]        out, dout: [batch, q_len, q_heads, v_dim]
//   lse: [batch, q_heads, q_len] (saved by forward: log-sum-exp of the scaled selected scores)
//   indices: [batch, q_len, topk] int32 key positions; a row holds distinct keys, each visible to
//     its query (j ≤ t + kv_len − q_len, bottom-right causal as in ops/attention.h, and j ≥
//     doc_start[t] with document masks), in any order,
//     padded with −1 after its count (so a row is a prefix of valid keys then −1s). Every row has
//     at least one valid key.
// Query head h reads key/value head h / (q_heads / kv_heads). scale is usually qk_dim^−½.
// Saved state: out, lse and the indices; never the probabilities.
// Gradient rule: dq, dk, dv are written (=); each dk/dv row sums its terms in a fixed order (query,
// column, query head), so results do not depend on the thread count or the tiling.
// Under the bf16 matmul precision (ops/gemm.h) the float kernels read q, k, v and dout rounded to
// bf16 (products of bf16 operands, float accumulation); the softmax, P, dS and all sums stay float.
#pragma once

#include <cstdint>

namespace trillion {

struct SparseAttentionSizes {
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t qk_dim = 0;
  int64_t v_dim = 0;
  int64_t topk = 0;  // columns of indices
  double scale = 0.0;
  const int32_t* doc_start = nullptr;  // [batch, q_len] document masks: each query's first visible key
};

// How the backward splits its work (tests shrink it to cover several chunks at small sizes).
struct SparseAttentionTiling {
  // Terms per query chunk of the backward: selected (query, key) pairs times the query heads that
  // share a kv head. Its buffers grow with it: P and dS of the chunk (2 MB in float) and two
  // chunks' pairs sorted by key (up to 4 MB). Larger chunks load and store each dk/dv row fewer
  // times: with 2^17, 2^18 and 2^19 the backward took 1.00 : 0.95 : 0.93 of the time at MLA's shape
  // (one query head per kv head; docs/benchmarks.md).
  int64_t chunk_terms = int64_t(1) << 18;
};

template <class T>
void sparse_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                              const SparseAttentionSizes& sizes);

template <class T>
void sparse_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const T* lse, const int32_t* indices, const SparseAttentionSizes& sizes,
                               const SparseAttentionTiling& tiling = {});

// The most bytes of temporaries (Buffers) sparse_attention_forward / _backward hold at once with
// `threads` OpenMP threads and element_bytes = sizeof(T), for the memory plan: the key counts
// [batch, q_len] (int32) throughout, with first the validation's marks [threads, kv_len] (bytes),
// then the per-thread tiles, one kv head's rows copied out (as bf16 when bf16_rows: float under the
// bf16 matmul precision), and in the backward the query chunks' buffers (SparseAttentionTiling).
int64_t sparse_attention_forward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                 int64_t element_bytes, bool bf16_rows);
int64_t sparse_attention_backward_workspace_bytes(const SparseAttentionSizes& sizes, int threads,
                                                  int64_t element_bytes, bool bf16_rows,
                                                  const SparseAttentionTiling& tiling = {});

}  // namespace trillion
