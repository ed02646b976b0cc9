// MLA's weight-absorbed form: the per-head products into and out of the latent space, and
// training's latent rows and weight with an adapter on kv_b_proj. See mla_absorbed.h.
#include "model/mla_absorbed.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/gemm.h"

namespace trillion {

template <class T>
void absorb_queries(T* q_abs, const T* q, const T* w_e, int64_t latent, int64_t n, const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, rope = dims.rope_dim, qk = dims.qk(), row = latent + rope;
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uk = w_e + hd * (nope + dims.v) * latent;  // [nope, L]
    // q_abs's latent part [n, L] = q_nope [n, nope] · W_UK
    gemm<T>(false, false, n, latent, nope, T(1), q + hd * qk, H * qk, w_uk, latent, T(0), q_abs + hd * row, H * row);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(q_abs + (t * H + hd) * row + latent, q + (t * H + hd) * qk + nope, rope * sizeof(T));
  }
}

template <class T>
void absorb_queries_backward(T* dq, T* dw_e, const T* dq_abs, const T* q, const T* w_e, int64_t latent, int64_t n,
                             const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, rope = dims.rope_dim, qk = dims.qk(), row = latent + rope;
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uk = w_e + hd * (nope + dims.v) * latent;  // [nope, L]
    // dq_nope [n, nope] = dq_abs's latent part [n, L] · W_UKᵀ;  dW_UK [nope, L] += q_nopeᵀ · dq_abs's latent part
    gemm<T>(false, true, n, nope, latent, T(1), dq_abs + hd * row, H * row, w_uk, latent, T(0), dq + hd * qk, H * qk);
    if (dw_e != nullptr)
      gemm<T>(true, false, nope, latent, n, T(1), q + hd * qk, H * qk, dq_abs + hd * row, H * row, T(1),
              dw_e + hd * (nope + dims.v) * latent, latent);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(dq + (t * H + hd) * qk + nope, dq_abs + (t * H + hd) * row + latent, rope * sizeof(T));
  }
}

template <class T>
void expand_outputs(T* out, const T* out_latent, const T* w_e, int64_t latent, int64_t n, const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, dv = dims.v;
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uv = w_e + (hd * (nope + dv) + nope) * latent;  // [v, L]
    // out [n, v] = out_latent [n, L] · W_UVᵀ
    gemm<T>(false, true, n, dv, latent, T(1), out_latent + hd * latent, H * latent, w_uv, latent, T(0), out + hd * dv,
            H * dv);
  }
}

template <class T>
void expand_outputs_backward(T* d_out_latent, T* dw_e, const T* d_out, const T* out_latent, const T* w_e,
                             int64_t latent, int64_t n, const MlaDims& dims) {
  const int64_t H = dims.heads, nope = dims.nope, dv = dims.v;
  for (int64_t hd = 0; hd < H; ++hd) {
    const T* w_uv = w_e + (hd * (nope + dv) + nope) * latent;  // [v, L]
    // d_out_latent [n, L] = d_out [n, v] · W_UV;  dW_UV [v, L] += d_outᵀ · out_latent
    gemm<T>(false, false, n, latent, dv, T(1), d_out + hd * dv, H * dv, w_uv, latent, T(0), d_out_latent + hd * latent,
            H * latent);
    if (dw_e != nullptr)
      gemm<T>(true, false, dv, latent, n, T(1), d_out + hd * dv, H * dv, out_latent + hd * latent, H * latent, T(1),
              dw_e + (hd * (nope + dv) + nope) * latent, latent);
  }
}

template <class T>
const T* absorbed_weight(const LinearWeights<T>& kv_b, const MlaDims& dims, Arena& scratch) {
  const int64_t rkv = dims.kv_lora_rank, rank = dims.kv_b_adapter_rank, latent = dims.absorbed_latent();
  const int64_t bound = kv_b.lora.a == nullptr ? 0 : kv_b.lora.rank;
  TRILLION_CHECK(bound == rank, "MLA: kv_b_proj's adapter has rank ", bound, " (0: none), its layer was planned with ",
                 rank);
  if (rank == 0) return kv_b.weight;
  T* w_e = scratch.alloc<T>(dims.kv_b_out() * latent);  // [H·(nope + v), L] = [kv_b_proj | B]
  for (int64_t o = 0; o < dims.kv_b_out(); ++o) {
    std::memcpy(w_e + o * latent, kv_b.weight + o * rkv, rkv * sizeof(T));
    std::memcpy(w_e + o * latent + rkv, kv_b.lora.b + o * rank, rank * sizeof(T));
  }
  return w_e;
}

template <class T>
void absorbed_weight_grad(const LinearWeights<T>& grads, const T* dw_e, const MlaDims& dims) {
  const int64_t rkv = dims.kv_lora_rank, rank = dims.kv_b_adapter_rank, latent = dims.absorbed_latent();
  for (int64_t o = 0; o < dims.kv_b_out(); ++o) {
    const T* row = dw_e + o * latent;  // [L]
    if (grads.weight != nullptr)
      for (int64_t i = 0; i < rkv; ++i) grads.weight[o * rkv + i] += row[i];
    if (grads.lora.b != nullptr)
      for (int64_t j = 0; j < rank; ++j) grads.lora.b[o * rank + j] += row[rkv + j];
  }
}

template <class T>
void latent_rows(T* rows, const T* latent, const T* kv_a, const LinearWeights<T>& kv_b, int64_t n,
                 const MlaDims& dims) {
  const int64_t rkv = dims.kv_lora_rank, rank = dims.kv_b_adapter_rank, width = dims.absorbed_latent();
  const int64_t row = width + dims.rope_dim, cw = dims.kv_a_out();
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(rows + t * row, latent + t * rkv, rkv * sizeof(T));
    std::memcpy(rows + t * row + width, kv_a + t * cw + rkv, dims.rope_dim * sizeof(T));
  }
  if (rank == 0) return;
  Buffer<T> u(n * rank);  // [n, r_a] dropout(c) · Aᵀ
  lora_down(u.data(), latent, kv_b.lora, n, rkv);
  const T scaling = T(kv_b.lora.scaling);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < rank; ++j) rows[t * row + rkv + j] = scaling * u[t * rank + j];
}

template <class T>
void latent_rows_backward(T* d_latent, T* d_kv_a, const LinearWeights<T>& grads, const T* d_rows, const T* latent,
                          const LinearWeights<T>& kv_b, int64_t n, const MlaDims& dims) {
  const int64_t rkv = dims.kv_lora_rank, rank = dims.kv_b_adapter_rank, width = dims.absorbed_latent();
  const int64_t row = width + dims.rope_dim, cw = dims.kv_a_out();
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(d_latent + t * rkv, d_rows + t * row, rkv * sizeof(T));
    std::memcpy(d_kv_a + t * cw + rkv, d_rows + t * row + width, dims.rope_dim * sizeof(T));
  }
  if (rank == 0) return;
  Buffer<T> du(n * rank);  // [n, r_a] the gradient wrt u: scaling · that of its columns
  const T scaling = T(kv_b.lora.scaling);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < rank; ++j) du[t * rank + j] = scaling * d_rows[t * row + rkv + j];
  lora_down_grad(d_latent, grads.lora.a, du.data(), latent, kv_b.lora, n, rkv);
}

namespace {

// The whole rows from this rank's latent c [n, r_kv] and kv_a [n, r_kv + rope], in scratch.
template <class T>
WholeRows<T> gather_whole_rows(const T* latent, const T* kv_a, const LinearWeights<T>& kv_b, int64_t batch, int64_t seq,
                               const MlaDims& dims, ContextExchange& context, Arena& scratch) {
  const int64_t n = batch * seq, width = dims.absorbed_latent(), row = dims.absorbed_row();
  const int64_t m = batch * context.sequence_length();
  T* own = scratch.alloc<T>(n * row);  // [n, L + rope] this rank's [e | k_rot]
  latent_rows(own, latent, kv_a, kv_b, n, dims);
  const WholeRows<T> whole{scratch.alloc<T>(m * row), scratch.alloc<T>(m * width)};
  context.gather_sequences(whole.rows, own, batch, row);
  for (int64_t t = 0; t < m; ++t) std::memcpy(whole.latent + t * width, whole.rows + t * row, width * sizeof(T));
  return whole;
}

}  // namespace

template <class T>
AbsorbedOperands<T> absorbed_operands(const T* q, const T* latent, const T* kv_a, const LinearWeights<T>& kv_b,
                                      const MlaDims& dims, const AttentionSizes& sizes, ContextExchange& context,
                                      Arena& scratch) {
  const int64_t n = sizes.batch * sizes.q_len;
  const T* w_e = absorbed_weight(kv_b, dims, scratch);
  const WholeRows<T> whole = gather_whole_rows(latent, kv_a, kv_b, sizes.batch, sizes.q_len, dims, context, scratch);
  T* q_abs = scratch.alloc<T>(n * dims.heads * dims.absorbed_row());  // [n, H, L + rope]
  absorb_queries(q_abs, q, w_e, dims.absorbed_latent(), n, dims);
  return {w_e, whole, q_abs};
}

template <class T>
void absorbed_attention_backward(const LatentGrads<T>& g, const T* d_out, const T* q, const T* latent, const T* kv_a,
                                 const T* out_latent, const T* lse, const int32_t* selection, const T* w_e,
                                 const LinearWeights<T>& kv_b, const LinearWeights<T>& kv_b_grads, const MlaDims& dims,
                                 const AttentionSizes& sizes, ContextExchange& context, Arena& scratch) {
  const int64_t batch = sizes.batch, n = batch * sizes.q_len, H = dims.heads;
  const int64_t width = dims.absorbed_latent(), row = dims.absorbed_row();
  const int64_t m = batch * context.sequence_length();
  T* d_out_latent = scratch.alloc<T>(n * H * width);  // [n, H, L]
  // dW_e [H·(nope + v), L], unless kv_b_proj is frozen with no adapter (allocated either way: the plan's)
  T* dw_e = scratch.alloc<T>(dims.kv_b_out() * width);
  const bool trains = kv_b_grads.weight != nullptr || kv_b_grads.lora.b != nullptr;
  if (trains)
    std::fill(dw_e, dw_e + dims.kv_b_out() * width, T(0));
  else
    dw_e = nullptr;
  expand_outputs_backward(d_out_latent, dw_e, d_out, out_latent, w_e, width, n, dims);
  const WholeRows<T> whole = gather_whole_rows(latent, kv_a, kv_b, batch, sizes.q_len, dims, context, scratch);
  T* q_abs = scratch.alloc<T>(n * H * row);   // [n, H, L + rope]
  T* dq_abs = scratch.alloc<T>(n * H * row);  // [n, H, L + rope]
  T* d_rows = scratch.alloc<T>(m * row);      // [m, L + rope] this rank's terms
  T* d_values = scratch.alloc<T>(m * width);  // [m, L]
  absorb_queries(q_abs, q, w_e, width, n, dims);
  context.gathered_attention_backward(dq_abs, d_rows, d_values, d_out_latent, q_abs, whole.rows, whole.latent,
                                      out_latent, lse, selection, dims.indexer.topk, sizes);
  absorb_queries_backward(g.dq, dw_e, dq_abs, q, w_e, width, n, dims);
  if (trains) absorbed_weight_grad(kv_b_grads, dw_e, dims);
  for (int64_t t = 0; t < m; ++t)  // the values are the rows' latent part
    for (int64_t i = 0; i < width; ++i) d_rows[t * row + i] += d_values[t * width + i];
  T* d_own = scratch.alloc<T>(n * row);  // [n, L + rope] the group's sum at this rank's tokens
  context.reduce_sequences(d_own, d_rows, batch, row);
  latent_rows_backward(g.d_latent, g.d_kv_a, kv_b_grads, d_own, latent, kv_b, n, dims);
}

#define TRILLION_INSTANTIATE(T)                                                                                       \
  template void absorb_queries<T>(T*, const T*, const T*, int64_t, int64_t, const MlaDims&);                          \
  template void absorb_queries_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, const MlaDims&);   \
  template void expand_outputs<T>(T*, const T*, const T*, int64_t, int64_t, const MlaDims&);                          \
  template void expand_outputs_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, const MlaDims&);   \
  template const T* absorbed_weight<T>(const LinearWeights<T>&, const MlaDims&, Arena&);                              \
  template void absorbed_weight_grad<T>(const LinearWeights<T>&, const T*, const MlaDims&);                           \
  template void latent_rows<T>(T*, const T*, const T*, const LinearWeights<T>&, int64_t, const MlaDims&);             \
  template void latent_rows_backward<T>(T*, T*, const LinearWeights<T>&, const T*, const T*, const LinearWeights<T>&, \
                                        int64_t, const MlaDims&);                                                     \
  template AbsorbedOperands<T> absorbed_operands<T>(const T*, const T*, const T*, const LinearWeights<T>&,            \
                                                    const MlaDims&, const AttentionSizes&, ContextExchange&, Arena&); \
  template void absorbed_attention_backward<T>(const LatentGrads<T>&, const T*, const T*, const T*, const T*,         \
                                               const T*, const T*, const int32_t*, const T*, const LinearWeights<T>&, \
                                               const LinearWeights<T>&, const MlaDims&, const AttentionSizes&,        \
                                               ContextExchange&, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
