// Causal softmax attention with grouped-query heads, computed in tiles with an online softmax
// (FlashAttention-2 style): never a full [q_len, kv_len] score matrix.
//
// Layouts (row-major, one sequence per batch entry):
//   q, dq: [batch, q_len, q_heads, head_dim]      out, dout: [batch, q_len, q_heads, v_dim]
//   k, dk: [batch, kv_len, kv_heads, head_dim]    v, dv: [batch, kv_len, kv_heads, v_dim]
//   lse: [batch, q_heads, q_len] (saved by forward: log-sum-exp of the scaled scores of each row)
// Query head h reads key/value head h / (q_heads / kv_heads). Causality is bottom-right aligned:
// query i (0-based) sees keys j ≤ i + (kv_len − q_len), so q_len == kv_len is training and
// q_len < kv_len is decoding against a KV cache. scale is usually head_dim^−½. head_dim is the
// query/key head dim; the value head dim may differ (MLA: 192 and 128).
// Document masks (packed training rows): with doc_start [batch, q_len], key positions
// non-decreasing in t, query t sees only keys doc_start[t] ≤ j ≤ t + (kv_len − q_len) (the first
// token of its document onward). q_len < kv_len with masks is a chunk of a sequence's queries
// against the keys up to its end (parallel/context_parallel.h).
// Gradient rule: dq, dk, dv are written (=).
#pragma once

#include <cstdint>

namespace trillion {

struct AttentionSizes {
  int64_t batch = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // query/key head dim
  double scale = 0.0;
  int64_t v_dim = 0;  // value (and output) head dim; 0 means head_dim
  const int32_t* doc_start = nullptr;  // [batch, q_len] first visible key per query; null: 0
  int64_t value_dim() const { return v_dim > 0 ? v_dim : head_dim; }
};

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& sizes);

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionSizes& sizes);

// The bytes of attention_forward's and attention_backward's temporaries (Buffers) with `threads`
// OpenMP threads and element_bytes = sizeof(T), for the memory plan: the forward's per-thread
// tiles; the backward's per-thread tiles and row_dot [batch, q_heads, q_len].
int64_t attention_forward_workspace_bytes(const AttentionSizes& sizes, int threads, int64_t element_bytes);
int64_t attention_backward_workspace_bytes(const AttentionSizes& sizes, int threads, int64_t element_bytes);

}  // namespace trillion
