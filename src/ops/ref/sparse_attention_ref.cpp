// Plain sparse attention (see sparse_attention_ref.h): the selection as a dense mask per batch
// entry, one head at a time, full score matrices, gemm() (ops/gemm.h) for the matrix products,
// std::exp for the softmax.
#include "ops/ref/sparse_attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

void check_sizes(const SparseAttentionSizes& s) {
  TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.qk_dim > 0 && s.v_dim > 0 && s.kv_heads > 0 && s.topk > 0,
                 "bad sparse attention sizes");
  TRILLION_CHECK(s.q_len <= s.kv_len, "q_len ", s.q_len, " > kv_len ", s.kv_len);
  TRILLION_CHECK(s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " not a multiple of kv_heads ", s.kv_heads);
}

// selected[q_len, kv_len] ← 1 where batch entry b's query t selects key j, else 0.
void build_mask(uint8_t* selected, const int32_t* indices, int64_t b, const SparseAttentionSizes& s) {
  std::fill(selected, selected + s.q_len * s.kv_len, uint8_t(0));
  for (int64_t t = 0; t < s.q_len; ++t) {
    const int32_t* row = indices + (b * s.q_len + t) * s.topk;
    const int64_t visible_end = t + s.kv_len - s.q_len + 1;
    const int64_t visible_begin = s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0;
    int64_t count = 0;
    for (int64_t c = 0; c < s.topk && row[c] != -1; ++c, ++count) {
      TRILLION_CHECK(row[c] >= visible_begin && row[c] < visible_end, "index ", row[c], " not visible to query ", t);
      TRILLION_CHECK(selected[t * s.kv_len + row[c]] == 0, "index ", row[c], " repeated for query ", t);
      selected[t * s.kv_len + row[c]] = 1;
    }
    TRILLION_CHECK(count > 0, "query ", t, " selects no key");
  }
}

// probs[q_len, kv_len] = softmax over the selected keys of scale · q_h k_hᵀ for one (batch, head),
// 0 outside the selection; returns each row's log-sum-exp in lse_row[q_len] when it is not null.
template <class T>
void head_probabilities(T* probs, T* lse_row, const uint8_t* selected, const T* q_head, const T* k_head,
                        const SparseAttentionSizes& s) {
  const int64_t q_stride = s.q_heads * s.qk_dim;
  const int64_t k_stride = s.kv_heads * s.qk_dim;
  gemm<T>(false, true, s.q_len, s.kv_len, s.qk_dim, T(s.scale), q_head, q_stride, k_head, k_stride, T(0), probs,
          s.kv_len);
  parallel_for(s.q_len, [&](int64_t i) {
    T* row = probs + i * s.kv_len;
    const uint8_t* mask = selected + i * s.kv_len;
    for (int64_t j = 0; j < s.kv_len; ++j)
      if (mask[j] == 0) row[j] = -std::numeric_limits<T>::infinity();
    T max_score = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < s.kv_len; ++j) max_score = std::max(max_score, row[j]);
    T sum = 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      row[j] = std::exp(row[j] - max_score);  // exp(−inf) = 0 outside the selection
      sum += row[j];
    }
    for (int64_t j = 0; j < s.kv_len; ++j) row[j] /= sum;
    if (lse_row != nullptr) lse_row[i] = max_score + std::log(sum);
  });
}

}  // namespace

template <class T>
void sparse_attention_ref_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* indices,
                                  const SparseAttentionSizes& s) {
  check_sizes(s);
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t q_stride = s.q_heads * s.qk_dim, out_stride = s.q_heads * s.v_dim;
  const int64_t k_stride = s.kv_heads * s.qk_dim, v_stride = s.kv_heads * s.v_dim;
  Buffer<uint8_t> selected(s.q_len * s.kv_len);  // [q_len, kv_len]
  Buffer<T> probs(s.q_len * s.kv_len);           // [q_len, kv_len]
  for (int64_t b = 0; b < s.batch; ++b) {
    build_mask(selected.data(), indices, b, s);
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kvh = h / group;
      const T* q_head = q + b * s.q_len * q_stride + h * s.qk_dim;      // [q_len, qk_dim], row stride q_stride
      const T* k_head = k + b * s.kv_len * k_stride + kvh * s.qk_dim;   // [kv_len, qk_dim], row stride k_stride
      const T* v_head = v + b * s.kv_len * v_stride + kvh * s.v_dim;    // [kv_len, v_dim], row stride v_stride
      T* out_head = out + b * s.q_len * out_stride + h * s.v_dim;       // [q_len, v_dim], row stride out_stride
      head_probabilities(probs.data(), lse + (b * s.q_heads + h) * s.q_len, selected.data(), q_head, k_head, s);
      gemm<T>(false, false, s.q_len, s.v_dim, s.kv_len, T(1), probs.data(), s.kv_len, v_head, v_stride, T(0),
              out_head, out_stride);
    }
  }
}

template <class T>
void sparse_attention_ref_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                   const int32_t* indices, const SparseAttentionSizes& s) {
  check_sizes(s);
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t q_stride = s.q_heads * s.qk_dim, out_stride = s.q_heads * s.v_dim;
  const int64_t k_stride = s.kv_heads * s.qk_dim, v_stride = s.kv_heads * s.v_dim;
  Buffer<uint8_t> selected(s.q_len * s.kv_len);  // [q_len, kv_len]
  Buffer<T> probs(s.q_len * s.kv_len);           // [q_len, kv_len]
  Buffer<T> dscores(s.q_len * s.kv_len);         // [q_len, kv_len]: dP, then dS in place
  std::fill(dk, dk + s.batch * s.kv_len * k_stride, T(0));
  std::fill(dv, dv + s.batch * s.kv_len * v_stride, T(0));
  for (int64_t b = 0; b < s.batch; ++b) {
    build_mask(selected.data(), indices, b, s);
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kvh = h / group;
      const int64_t q_off = b * s.q_len * q_stride + h * s.qk_dim;     // q, dq head: [q_len, qk_dim]
      const int64_t out_off = b * s.q_len * out_stride + h * s.v_dim;  // dout head: [q_len, v_dim]
      const int64_t k_off = b * s.kv_len * k_stride + kvh * s.qk_dim;  // k, dk head: [kv_len, qk_dim]
      const int64_t v_off = b * s.kv_len * v_stride + kvh * s.v_dim;   // v, dv head: [kv_len, v_dim]
      head_probabilities<T>(probs.data(), nullptr, selected.data(), q + q_off, k + k_off, s);
      // dv[kv_len, v_dim] += Pᵀ dout
      gemm<T>(true, false, s.kv_len, s.v_dim, s.q_len, T(1), probs.data(), s.kv_len, dout + out_off, out_stride,
              T(1), dv + v_off, v_stride);
      // dP[q_len, kv_len] = dout vᵀ
      gemm<T>(false, true, s.q_len, s.kv_len, s.v_dim, T(1), dout + out_off, out_stride, v + v_off, v_stride, T(0),
              dscores.data(), s.kv_len);
      parallel_for(s.q_len, [&](int64_t i) {
        const T* p = probs.data() + i * s.kv_len;
        T* d = dscores.data() + i * s.kv_len;
        T row_dot = 0;
        for (int64_t j = 0; j < s.kv_len; ++j) row_dot += p[j] * d[j];
        for (int64_t j = 0; j < s.kv_len; ++j) d[j] = p[j] * (d[j] - row_dot);
      });
      // dq[q_len, qk_dim] = scale · dS k;  dk[kv_len, qk_dim] += scale · dSᵀ q
      gemm<T>(false, false, s.q_len, s.qk_dim, s.kv_len, T(s.scale), dscores.data(), s.kv_len, k + k_off, k_stride,
              T(0), dq + q_off, q_stride);
      gemm<T>(true, false, s.kv_len, s.qk_dim, s.q_len, T(s.scale), dscores.data(), s.kv_len, q + q_off, q_stride,
              T(1), dk + k_off, k_stride);
    }
  }
}

void causal_all_indices(int32_t* indices, int64_t batch, int64_t q_len, int64_t kv_len, int64_t topk) {
  TRILLION_CHECK(q_len > 0 && q_len <= kv_len && topk >= kv_len, "causal_all_indices needs 0 < q_len ", q_len,
                 " <= kv_len ", kv_len, " <= topk ", topk);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < q_len; ++t) {
      int32_t* row = indices + (b * q_len + t) * topk;  // [topk]
      const int64_t visible_end = t + kv_len - q_len + 1;
      for (int64_t c = 0; c < topk; ++c) row[c] = c < visible_end ? int32_t(c) : -1;
    }
  }
}

template void sparse_attention_ref_forward<float>(float*, float*, const float*, const float*, const float*,
                                                  const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_ref_forward<double>(double*, double*, const double*, const double*, const double*,
                                                   const int32_t*, const SparseAttentionSizes&);
template void sparse_attention_ref_backward<float>(float*, float*, float*, const float*, const float*,
                                                   const float*, const float*, const int32_t*,
                                                   const SparseAttentionSizes&);
template void sparse_attention_ref_backward<double>(double*, double*, double*, const double*, const double*,
                                                    const double*, const double*, const int32_t*,
                                                    const SparseAttentionSizes&);

}  // namespace trillion
