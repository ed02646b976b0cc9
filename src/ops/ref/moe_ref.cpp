// The oracle and the fragmented baseline of the routed experts (see moe_ref.h).
#include "ops/ref/moe_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/activation.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

// kept[N · k]: whether slot t·k + j survives the capacity limit (slots in order, per expert).
std::vector<char> kept_slots(const int32_t* index, int64_t slots, int64_t capacity, int64_t experts) {
  std::vector<int64_t> count(experts, 0);  // [E]
  std::vector<char> kept(slots, 0);        // [N · k]
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = index[s];
    TRILLION_CHECK(e >= 0 && e < experts, "moe oracle: index ", e, " outside [0, ", experts, ")");
    kept[s] = capacity <= 0 || count[e] < capacity;
    if (kept[s]) ++count[e];
  }
  return kept;
}

// One slot's forward: gu[2I] = gate_up_e[2I, H] · x_row[H], act[I] = silu(gu[:I]) · gu[I:],
// out[H] = down_e[H, I] · act.
template <class T>
void slot_forward(T* gu, T* act, T* out, const T* x_row, const T* gate_up_e, const T* down_e, int64_t H, int64_t I) {
  for (int64_t r = 0; r < 2 * I; ++r) {
    T sum = 0;
    for (int64_t h = 0; h < H; ++h) sum += gate_up_e[r * H + h] * x_row[h];
    gu[r] = sum;
  }
  for (int64_t i = 0; i < I; ++i) act[i] = gu[i] / (T(1) + std::exp(-gu[i])) * gu[I + i];
  for (int64_t h = 0; h < H; ++h) {
    T sum = 0;
    for (int64_t i = 0; i < I; ++i) sum += down_e[h * I + i] * act[i];
    out[h] = sum;
  }
}

// dst[n, width] ← rows src[token of each of the expert's rows, width].
template <class T>
void gather_rows(T* dst, const T* src, const MoePlan& plan, int64_t first_row, int64_t n, int64_t width) {
  parallel_for(n, [&](int64_t r) {
    std::memcpy(dst + r * width, src + (plan.row_slot[first_row + r] / plan.top_k) * width, width * sizeof(T));
  });
}

// dst[token of each row, width] += src[n, width], rows in order (index_add_).
template <class T>
void scatter_add_rows(T* dst, const T* src, const MoePlan& plan, int64_t first_row, int64_t n, int64_t width) {
  for (int64_t r = 0; r < n; ++r) {
    T* d = dst + (plan.row_slot[first_row + r] / plan.top_k) * width;
    for (int64_t c = 0; c < width; ++c) d[c] += src[r * width + c];
  }
}

}  // namespace

template <class T>
void moe_oracle_forward(T* y, const T* x, const T* gate_up, const T* down, const T* weight, const int32_t* index,
                        int64_t tokens, int64_t top_k, int64_t capacity, const MoeExpertDims& dims) {
  const int64_t H = dims.hidden, I = dims.intermediate;
  const std::vector<char> kept = kept_slots(index, tokens * top_k, capacity, dims.experts);
  std::vector<T> gu(2 * I), act(I), out(H);  // one slot's intermediates
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t s = t * top_k + j;
      if (!kept[s]) continue;
      const int64_t e = index[s];
      slot_forward(gu.data(), act.data(), out.data(), x + t * H, gate_up + e * 2 * I * H, down + e * H * I, H, I);
      for (int64_t h = 0; h < H; ++h) y[t * H + h] += weight[s] * out[h];
    }
}

template <class T>
void moe_oracle_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* x, const T* gate_up,
                         const T* down, const T* weight, const int32_t* index, int64_t tokens, int64_t top_k,
                         int64_t capacity, const MoeExpertDims& dims) {
  const int64_t H = dims.hidden, I = dims.intermediate;
  const std::vector<char> kept = kept_slots(index, tokens * top_k, capacity, dims.experts);
  std::vector<T> gu(2 * I), act(I), out(H), d_out(H), d_act(I), d_gu(2 * I);  // one slot's tensors
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t s = t * top_k + j;
      dweight[s] = T(0);
      if (!kept[s]) continue;
      const int64_t e = index[s];
      const T* gate_up_e = gate_up + e * 2 * I * H;  // [2I, H]
      const T* down_e = down + e * H * I;            // [H, I]
      const T* x_row = x + t * H;
      const T* dy_row = dy + t * H;
      slot_forward(gu.data(), act.data(), out.data(), x_row, gate_up_e, down_e, H, I);
      for (int64_t h = 0; h < H; ++h) {
        dweight[s] += dy_row[h] * out[h];
        d_out[h] = weight[s] * dy_row[h];
      }
      for (int64_t i = 0; i < I; ++i) {
        T sum = 0;
        for (int64_t h = 0; h < H; ++h) sum += d_out[h] * down_e[h * I + i];
        d_act[i] = sum;
      }
      if (ddown != nullptr)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < I; ++i) ddown[e * H * I + h * I + i] += d_out[h] * act[i];
      for (int64_t i = 0; i < I; ++i) {
        const T g = gu[i], u = gu[I + i];
        const T sig = T(1) / (T(1) + std::exp(-g));
        d_gu[i] = d_act[i] * u * sig * (T(1) + g * (T(1) - sig));
        d_gu[I + i] = d_act[i] * g * sig;
      }
      for (int64_t r = 0; r < 2 * I; ++r)
        for (int64_t h = 0; h < H; ++h) {
          dx[t * H + h] += d_gu[r] * gate_up_e[r * H + h];
          if (dgate_up != nullptr) dgate_up[e * 2 * I * H + r * H + h] += d_gu[r] * x_row[h];
        }
    }
}

template <class T>
void moe_fragmented_forward(T* y, MoeFragmentedSaved<T>& saved, const T* x, const T* gate_up, const T* down,
                            const T* weight, const MoePlan& plan, const MoeExpertDims& dims) {
  const int64_t H = dims.hidden, I = dims.intermediate, E = dims.experts;
  TRILLION_CHECK(plan.experts == E, "moe fragmented: plan for ", plan.experts, " experts, dims say ", E);
  for (auto* list : {&saved.x, &saved.gate, &saved.up, &saved.act, &saved.out, &saved.weight}) {
    list->clear();
    list->resize(E);
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = plan.offsets[e], n = plan.offsets[e + 1] - r0;
    if (n == 0) continue;
    Buffer<T> xe(n * H);  // [n, H]
    gather_rows(xe.data(), x, plan, r0, n, H);
    Buffer<T> gu(n * 2 * I);  // [n, 2I]
    linear_forward(gu.data(), xe.data(), gate_up + e * 2 * I * H, n, H, 2 * I);
    Buffer<T> gate(n * I), up(n * I);  // [n, I] each: gu.chunk(2, -1), made contiguous
    parallel_for(n, [&](int64_t r) {
      std::memcpy(gate.data() + r * I, gu.data() + r * 2 * I, I * sizeof(T));
      std::memcpy(up.data() + r * I, gu.data() + r * 2 * I + I, I * sizeof(T));
    });
    Buffer<T> act(n * I);  // [n, I]
    swiglu_forward(act.data(), gate.data(), up.data(), n * I);
    Buffer<T> out(n * H);  // [n, H]
    linear_forward(out.data(), act.data(), down + e * H * I, n, I, H);
    Buffer<T> we(n);  // [n]
    for (int64_t r = 0; r < n; ++r) we[r] = weight[plan.row_slot[r0 + r]];
    Buffer<T> weighted(n * H);  // [n, H]
    parallel_for(n, [&](int64_t r) {
      for (int64_t h = 0; h < H; ++h) weighted[r * H + h] = we[r] * out[r * H + h];
    });
    scatter_add_rows(y, weighted.data(), plan, r0, n, H);
    saved.x[e] = std::move(xe);
    saved.gate[e] = std::move(gate);
    saved.up[e] = std::move(up);
    saved.act[e] = std::move(act);
    saved.out[e] = std::move(out);
    saved.weight[e] = std::move(we);
  }
}

template <class T>
void moe_fragmented_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const MoeFragmentedSaved<T>& saved,
                             const T* gate_up, const T* down, const MoePlan& plan, const MoeExpertDims& dims) {
  const int64_t H = dims.hidden, I = dims.intermediate, E = dims.experts;
  TRILLION_CHECK(static_cast<int64_t>(saved.x.size()) == E, "moe fragmented backward without its forward");
  std::fill(dweight, dweight + plan.tokens * plan.top_k, T(0));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = plan.offsets[e], n = plan.offsets[e + 1] - r0;
    if (n == 0) continue;
    const T* gate_up_e = gate_up + e * 2 * I * H;  // [2I, H]
    const T* down_e = down + e * H * I;            // [H, I]
    Buffer<T> dye(n * H);                          // [n, H]
    gather_rows(dye.data(), dy, plan, r0, n, H);
    Buffer<T> dwe(n);  // [n]: rowsum(dye ⊙ out)
    parallel_for(n, [&](int64_t r) {
      T sum = 0;
      for (int64_t h = 0; h < H; ++h) sum += dye[r * H + h] * saved.out[e][r * H + h];
      dwe[r] = sum;
    });
    for (int64_t r = 0; r < n; ++r) dweight[plan.row_slot[r0 + r]] = dwe[r];
    Buffer<T> d_out(n * H);  // [n, H]
    parallel_for(n, [&](int64_t r) {
      for (int64_t h = 0; h < H; ++h) d_out[r * H + h] = saved.weight[e][r] * dye[r * H + h];
    });
    Buffer<T> d_act(n * I);  // [n, I] = d_out · down_e;  ddown[e] += d_outᵀ · act
    linear_backward(d_act.data(), ddown != nullptr ? ddown + e * H * I : nullptr, d_out.data(), saved.act[e].data(),
                    down_e, n, I, H, false);
    Buffer<T> d_gate(n * I), d_up(n * I);  // [n, I] each
    swiglu_backward(d_gate.data(), d_up.data(), d_act.data(), saved.gate[e].data(), saved.up[e].data(), n * I);
    Buffer<T> d_gu(n * 2 * I);  // [n, 2I] = cat(d_gate, d_up)
    parallel_for(n, [&](int64_t r) {
      std::memcpy(d_gu.data() + r * 2 * I, d_gate.data() + r * I, I * sizeof(T));
      std::memcpy(d_gu.data() + r * 2 * I + I, d_up.data() + r * I, I * sizeof(T));
    });
    Buffer<T> dxe(n * H);  // [n, H] = d_gu · gate_up_e;  dgate_up[e] += d_guᵀ · xe
    linear_backward(dxe.data(), dgate_up != nullptr ? dgate_up + e * 2 * I * H : nullptr, d_gu.data(),
                    saved.x[e].data(), gate_up_e, n, H, 2 * I, false);
    scatter_add_rows(dx, dxe.data(), plan, r0, n, H);
  }
}

#define TRILLION_INSTANTIATE_MOE_REF(T)                                                                                \
  template void moe_oracle_forward<T>(T*, const T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t,    \
                                      int64_t, const MoeExpertDims&);                                                  \
  template void moe_oracle_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*,               \
                                       const int32_t*, int64_t, int64_t, int64_t, const MoeExpertDims&);               \
  template void moe_fragmented_forward<T>(T*, MoeFragmentedSaved<T>&, const T*, const T*, const T*, const T*,          \
                                          const MoePlan&, const MoeExpertDims&);                                       \
  template void moe_fragmented_backward<T>(T*, T*, T*, T*, const T*, const MoeFragmentedSaved<T>&, const T*, const T*, \
                                           const MoePlan&, const MoeExpertDims&);
TRILLION_INSTANTIATE_MOE_REF(float)
TRILLION_INSTANTIATE_MOE_REF(double)
#undef TRILLION_INSTANTIATE_MOE_REF

}  // namespace trillion
