// Plain causal GQA attention (see attention_ref.h): one head at a time, full score matrices,
// gemm() (ops/gemm.h) for the matrix products, std::exp for the softmax.
#include "ops/ref/attention_ref.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

void check_sizes(const AttentionSizes& s) {
  TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.head_dim > 0 && s.kv_heads > 0, "bad attention sizes");
  TRILLION_CHECK(s.q_len <= s.kv_len, "q_len ", s.q_len, " > kv_len ", s.kv_len);
  TRILLION_CHECK(s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " not a multiple of kv_heads ", s.kv_heads);
}

// probs[q_len, kv_len] = causal softmax(scale · q_h k_hᵀ) for one (batch b, head), keys before a
// query's document (s.doc_start) hidden too; returns each row's log-sum-exp in lse_row[q_len] when
// it is not null.
template <class T>
void head_probabilities(T* probs, T* lse_row, const T* q_head, const T* k_head, const AttentionSizes& s, int64_t b) {
  const int64_t q_stride = s.q_heads * s.head_dim;
  const int64_t kv_stride = s.kv_heads * s.head_dim;
  const int64_t offset = s.kv_len - s.q_len;
  gemm<T>(false, true, s.q_len, s.kv_len, s.head_dim, T(s.scale), q_head, q_stride, k_head, kv_stride, T(0),
          probs, s.kv_len);
  parallel_for(s.q_len, [&](int64_t i) {
    T* row = probs + i * s.kv_len;
    const int64_t visible = i + offset + 1;  // keys first .. i + offset
    const int64_t first = s.doc_start != nullptr ? s.doc_start[b * s.q_len + i] : 0;
    T max_score = -std::numeric_limits<T>::infinity();
    for (int64_t j = first; j < visible; ++j) max_score = std::max(max_score, row[j]);
    T sum = 0;
    for (int64_t j = first; j < visible; ++j) {
      row[j] = std::exp(row[j] - max_score);
      sum += row[j];
    }
    for (int64_t j = first; j < visible; ++j) row[j] /= sum;
    for (int64_t j = 0; j < first; ++j) row[j] = 0;
    for (int64_t j = visible; j < s.kv_len; ++j) row[j] = 0;
    if (lse_row != nullptr) lse_row[i] = max_score + std::log(sum);
  });
}

}  // namespace

template <class T>
void attention_ref_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& s) {
  check_sizes(s);
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t dv = s.value_dim();
  const int64_t q_stride = s.q_heads * s.head_dim, out_stride = s.q_heads * dv;
  const int64_t kv_stride = s.kv_heads * s.head_dim, v_stride = s.kv_heads * dv;
  Buffer<T> probs(s.q_len * s.kv_len);  // [q_len, kv_len]
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kvh = h / group;
      const T* q_head = q + b * s.q_len * q_stride + h * s.head_dim;     // [q_len, head_dim], row stride q_stride
      const T* k_head = k + b * s.kv_len * kv_stride + kvh * s.head_dim; // [kv_len, head_dim]
      const T* v_head = v + b * s.kv_len * v_stride + kvh * dv;          // [kv_len, v_dim]
      T* out_head = out + b * s.q_len * out_stride + h * dv;             // [q_len, v_dim]
      head_probabilities(probs.data(), lse + (b * s.q_heads + h) * s.q_len, q_head, k_head, s, b);
      gemm<T>(false, false, s.q_len, dv, s.kv_len, T(1), probs.data(), s.kv_len, v_head, v_stride, T(0),
              out_head, out_stride);
    }
  }
}

template <class T>
void attention_ref_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                            const AttentionSizes& s) {
  check_sizes(s);
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t dvd = s.value_dim();
  const int64_t q_stride = s.q_heads * s.head_dim, out_stride = s.q_heads * dvd;
  const int64_t kv_stride = s.kv_heads * s.head_dim, v_stride = s.kv_heads * dvd;
  Buffer<T> probs(s.q_len * s.kv_len);   // [q_len, kv_len]
  Buffer<T> dscores(s.q_len * s.kv_len); // [q_len, kv_len]: dP, then dS in place
  for (int64_t i = 0; i < s.batch * s.kv_len * kv_stride; ++i) dk[i] = 0;
  for (int64_t i = 0; i < s.batch * s.kv_len * v_stride; ++i) dv[i] = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kvh = h / group;
      const int64_t q_off = b * s.q_len * q_stride + h * s.head_dim;
      const int64_t kv_off = b * s.kv_len * kv_stride + kvh * s.head_dim;
      const int64_t out_off = b * s.q_len * out_stride + h * dvd, v_off = b * s.kv_len * v_stride + kvh * dvd;
      head_probabilities<T>(probs.data(), nullptr, q + q_off, k + kv_off, s, b);
      // dv[kv_len, v_dim] += Pᵀ dout
      gemm<T>(true, false, s.kv_len, dvd, s.q_len, T(1), probs.data(), s.kv_len, dout + out_off, out_stride,
              T(1), dv + v_off, v_stride);
      // dP[q_len, kv_len] = dout vᵀ
      gemm<T>(false, true, s.q_len, s.kv_len, dvd, T(1), dout + out_off, out_stride, v + v_off, v_stride,
              T(0), dscores.data(), s.kv_len);
      parallel_for(s.q_len, [&](int64_t i) {
        const T* p = probs.data() + i * s.kv_len;
        T* d = dscores.data() + i * s.kv_len;
        T row_dot = 0;
        for (int64_t j = 0; j < s.kv_len; ++j) row_dot += p[j] * d[j];
        for (int64_t j = 0; j < s.kv_len; ++j) d[j] = p[j] * (d[j] - row_dot);
      });
      // dq[q_len, head_dim] = scale · dS k;  dk[kv_len, head_dim] += scale · dSᵀ q
      gemm<T>(false, false, s.q_len, s.head_dim, s.kv_len, T(s.scale), dscores.data(), s.kv_len, k + kv_off,
              kv_stride, T(0), dq + q_off, q_stride);
      gemm<T>(true, false, s.kv_len, s.head_dim, s.q_len, T(s.scale), dscores.data(), s.kv_len, q + q_off,
              q_stride, T(1), dk + kv_off, kv_stride);
    }
  }
}

template void attention_ref_forward<float>(float*, float*, const float*, const float*, const float*,
                                           const AttentionSizes&);
template void attention_ref_forward<double>(double*, double*, const double*, const double*, const double*,
                                            const AttentionSizes&);
template void attention_ref_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                            const float*, const AttentionSizes&);
template void attention_ref_backward<double>(double*, double*, double*, const double*, const double*,
                                             const double*, const double*, const AttentionSizes&);

}  // namespace trillion
