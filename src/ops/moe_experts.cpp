// The routed experts of an MoE layer (see moe_experts.h): the plan (a stable counting sort of the
// slots by expert, with the capacity limit), and the fused grouped-GEMM forward and backward.
//
// Forward: one parallel region over (expert, row tile) items, the tiles cut from each expert's rows
// of each token chunk (below) as the backward cuts them. An item gathers its tile's x rows into
// a contiguous per-thread tile, multiplies it by gate_up[e]ᵀ straight into the saved gate_up_out
// rows (an expert's permuted rows are contiguous), applies SwiGLU row by row while the tile is still
// in cache, and multiplies act by down[e]ᵀ into the rows' outputs, a forward-only buffer [rows, H]
// (not saved: the backward forms the weights' gradient from act). The combine then runs over tokens:
// each token's y row is summed by one thread over its slots j = 0..k−1.
//
// Backward runs over chunks of tokens (about kChunkRows slots each), so the input-gradient rows are
// materialized for one chunk at a time (dx_part) instead of all rows: a workspace of [kChunkRows, H]
// instead of [rows, H] (at the bench size 16 MB, not 64 MB, whose fresh pages cost more time than
// the extra chunk boundaries: −5 % backward time). An expert's rows are token
// ascending, so its rows in a chunk are one contiguous range. Per chunk, one parallel region over
// experts (largest first, for load balance): an expert's item walks its row tiles in order, gathers
// x and dy rows, computes the unweighted d_act = dy · down[e] (with its adapter's input gradient),
// the combine weight's gradient dweight[t, j] = <dy[t], out[row]> = <d_act[row], act[row]> (so the
// outputs need not be saved), then scales d_act and d_out = dy by the row's weight, the SwiGLU
// backward, dx_part = d_gu · gate_up[e], and the weight gradients dgate_up[e] += d_guᵀ · x_tile and
// ddown[e] += d_outᵀ · act, accumulated by that one thread in (chunk, tile) order, so deterministic.
// Then a pass over the chunk's tokens adds the k rows of dx_part to dx[t] in order j = 0..k−1.
// Given no saved gate_up rows or act, a tile forms them again from its x rows as its forward tile
// did (the same rows, the same products), so bitwise the values the forward saved.
//
// LoRA pairs on the experts (ExpertAdapters) run inside the same items, on the same tiles, through
// their rank (add_adapter, adapter_input_grad, adapter_weight_grads): the u and g tiles [M, r] join
// the per-thread workspace.
//
// Matrix products are single-threaded gemm() calls (ops/gemm.h) from inside the OpenMP region;
// workspaces are allocated before the regions. Nothing depends on the thread count.
#include "ops/moe_experts.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <type_traits>

#include "core/bf16.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/activation.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

// Measured at T=4096, H=512, E=64, k=8, I=256 (docs/benchmarks.md): 128, 256 and 512 row tiles are
// within 3 % of each other; one token chunk per 8192 slots beats one chunk (-5 % backward time) and
// 4096 (+10 %).
constexpr int64_t kTileRows = 256;      // permuted rows per tile, forward and backward alike
constexpr int64_t kChunkRows = 8192;    // slots per backward token chunk (bounds the dx workspace)

// Elements per thread, rounded up so every thread's slice starts on a 64-byte line.
int64_t per_thread_count(int64_t count, int64_t elem_bytes) {
  const int64_t per_line = 64 / elem_bytes;
  return (count + per_line - 1) / per_line * per_line;
}

// Per-thread workspace elements (M = kTileRows, r = the adapters' largest rank): forward x_tile
// [M, H], u [M, r]; backward x_tile [M, H], d_out [M, H], d_act [M, I], d_gu [M, 2I], u [M, r],
// g [M, r], and the gate_up rows [M, 2I] and act [M, I] it forms again when they were not saved
// (always allocated, so the memory plan needs no policy here).
int64_t forward_per_thread(const MoeExpertDims& dims, int64_t elem_bytes) {
  return per_thread_count(kTileRows * (dims.hidden + dims.adapter_rank), elem_bytes);
}
int64_t backward_per_thread(const MoeExpertDims& dims, int64_t elem_bytes) {
  return per_thread_count(kTileRows * (2 * dims.hidden + 6 * dims.intermediate + 2 * dims.adapter_rank),
                          elem_bytes);
}

// Tokens per backward chunk (about kChunkRows slots).
int64_t chunk_tokens_of(int64_t top_k) { return std::max<int64_t>(1, kChunkRows / top_k); }

// The plan's rows by token chunk and expert: an expert's rows are token ascending, so its rows of
// chunk c are one range [first[c·E + e], first[(c+1)·E + e]). Forward and backward cut their tiles
// from these ranges alike, so a backward tile that forms its rows again makes the forward's products.
std::vector<int64_t> chunk_firsts(const MoePlan& plan) {
  const int64_t N = plan.tokens, E = plan.experts, k = plan.top_k, chunk_tokens = chunk_tokens_of(k);
  const int64_t chunks = (N + chunk_tokens - 1) / chunk_tokens;
  std::vector<int64_t> first((chunks + 1) * E);  // [chunks + 1, E]
  for (int64_t c = 0; c <= chunks; ++c)
    for (int64_t e = 0; e < E; ++e) {
      const int32_t* begin = plan.row_slot.data() + plan.offsets[e];
      const int32_t* end = plan.row_slot.data() + plan.offsets[e + 1];
      const int64_t bound = std::min(c * chunk_tokens, N) * k;  // first slot of chunk c
      first[c * E + e] = std::lower_bound(begin, end, bound) - plan.row_slot.data();
    }
  return first;
}

template <class T>
void check_adapters(const ExpertAdapters<T>& adapters, const ExpertAdapters<T>& grads, const MoeExpertDims& dims) {
  const auto check = [&](const std::vector<ExpertLoraPair<T>>& pairs, const std::vector<ExpertLoraPair<T>>& pair_grads,
                         int64_t out) {
    TRILLION_CHECK(pair_grads.empty() || pair_grads.size() == pairs.size(), "moe experts: ", pair_grads.size(),
                   " adapter gradients for ", pairs.size(), " adapters");
    for (const ExpertLoraPair<T>& pair : pairs)
      TRILLION_CHECK(pair.rank >= 1 && pair.rank <= dims.adapter_rank && pair.row0 >= 0 && pair.rows >= 1 &&
                         pair.row0 + pair.rows <= out,
                     "moe experts: adapter of rank ", pair.rank, " on rows ", pair.row0, "..", pair.row0 + pair.rows,
                     " of ", out, " (largest rank ", dims.adapter_rank, ")");
  };
  check(adapters.gate_up, grads.gate_up, 2 * dims.intermediate);
  check(adapters.down, grads.down, dims.hidden);
  // The backward scales a down pair's g tile by the rows' weights in place: one pair, one tile.
  TRILLION_CHECK(adapters.down.size() <= 1, "moe experts: ", adapters.down.size(), " adapters on down (at most one)");
}

// out[m, row0 : row0 + rows] (row stride ldo) += scaling · (in[m, K] · A[e]ᵀ) · B[e]ᵀ, through u [m, r].
template <class T>
void add_adapter(T* out, int64_t ldo, const T* in, int64_t m, int64_t K, const ExpertLoraPair<T>& pair, int64_t e,
                 T* u) {
  const int64_t r = pair.rank;
  const T* a = pair.a + e * r * K;          // [r, K]
  const T* b = pair.b + e * pair.rows * r;  // [rows, r]
  gemm<T>(false, true, m, r, K, T(1), in, K, a, K, T(0), u, r);
  gemm<T>(false, true, m, pair.rows, r, T(pair.scaling), u, r, b, r, T(1), out + pair.row0, ldo);
}

// A tile's gate/up rows as the forward forms them: gu[m, 2I] = x_tile[m, H] · (gate_up[e] + its
// adapters)[2I, H]ᵀ, through u [m, r]. The backward forms dropped rows again with the same call.
template <class T>
void form_gate_up(T* gu, const T* x_tile, int64_t m, const T* gate_up_e, const ExpertAdapters<T>& adapters,
                  const MoeExpertDims& dims, int64_t e, T* u) {
  const int64_t H = dims.hidden, I = dims.intermediate;
  gemm<T>(false, true, m, 2 * I, H, T(1), x_tile, H, gate_up_e, H, T(0), gu, 2 * I);
  for (const ExpertLoraPair<T>& pair : adapters.gate_up) add_adapter(gu, 2 * I, x_tile, m, H, pair, e, u);
}

// act[m, I] = silu(gu[:, :I]) · gu[:, I:], row by row.
template <class T>
void form_act(T* act, const T* gu, int64_t m, int64_t I) {
  for (int64_t i = 0; i < m; ++i) swiglu_span(act + i * I, gu + i * 2 * I, gu + i * 2 * I + I, I);
}

// add_adapter's input gradient from d [m, row0 : row0 + rows] (row stride ldd), the gradient of its
// output slice: g = scaling · d · B[e] [m, r]; din[m, K] += g · A[e].
template <class T>
void adapter_input_grad(T* din, const T* d, int64_t ldd, int64_t m, int64_t K, const ExpertLoraPair<T>& pair,
                        int64_t e, T* g) {
  const int64_t r = pair.rank, rows = pair.rows;
  const T* a = pair.a + e * r * K;     // [r, K]
  const T* b = pair.b + e * rows * r;  // [rows, r]
  gemm<T>(false, false, m, r, rows, T(pair.scaling), d + pair.row0, ldd, b, r, T(0), g, r);
  gemm<T>(false, false, m, K, r, T(1), g, r, a, K, T(1), din, K);
}

// add_adapter's weight gradients from the same d and its g = scaling · d · B[e] [m, r]: u = in ·
// A[e]ᵀ [m, r], grad.b[e] += scaling · dᵀ · u and grad.a[e] += gᵀ · in (a null grad or grad.a: none).
template <class T>
void adapter_weight_grads(const T* d, int64_t ldd, const T* in, int64_t m, int64_t K, const ExpertLoraPair<T>& pair,
                          const ExpertLoraPair<T>* grad, int64_t e, T* u, const T* g) {
  if (grad == nullptr || grad->a == nullptr) return;
  const int64_t r = pair.rank, rows = pair.rows;
  const T* a = pair.a + e * r * K;  // [r, K]
  gemm<T>(false, true, m, r, K, T(1), in, K, a, K, T(0), u, r);
  gemm<T>(true, false, rows, r, m, T(pair.scaling), d + pair.row0, ldd, u, r, T(1), grad->b + e * rows * r, r);
  gemm<T>(true, false, r, K, m, T(1), g, r, in, K, T(1), grad->a + e * r * K, K);
}

// The gradient pair of adapter i, or null when the backward has none.
template <class T>
const ExpertLoraPair<T>* grad_of(const std::vector<ExpertLoraPair<T>>& grads, size_t i) {
  return grads.empty() ? nullptr : &grads[i];
}

void check_plan(const MoePlan& plan, const MoeExpertDims& dims) {
  TRILLION_CHECK(dims.hidden > 0 && dims.intermediate > 0 && dims.experts > 0, "moe experts dims H=", dims.hidden,
                 " I=", dims.intermediate, " E=", dims.experts);
  TRILLION_CHECK(plan.experts == dims.experts && static_cast<int64_t>(plan.offsets.size()) == dims.experts + 1,
                 "moe plan built for ", plan.experts, " experts, dims say ", dims.experts);
  TRILLION_CHECK(static_cast<int64_t>(plan.slot_row.size()) == plan.tokens * plan.top_k &&
                     static_cast<int64_t>(plan.row_slot.size()) == plan.rows(),
                 "moe plan is inconsistent: ", plan.slot_row.size(), " slots, ", plan.row_slot.size(), " rows");
}

// Σ a[i] · read(b[i]) in 16 interleaved partial sums (vectorizable), combined in a fixed order.
template <class T, class Read = std::identity>
T dot(const T* a, const T* b, int64_t n, Read read = {}) {
  constexpr int64_t kLanes = 16;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[i + l] * read(b[i + l]);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += a[i] * read(b[i]);
  T sum = 0;
  for (int64_t l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// dweight's <d_act, act> as the forward's down product read act: its bf16 rounding when
// `act_in_bf16` (float under the bf16 matmul precision), so act saved in float or as its bf16
// rounding gives the same bits.
template <class T>
T dot_with_act(const T* d_act, const T* act, int64_t n, bool act_in_bf16) {
  if constexpr (std::is_same_v<T, float>) {
    if (act_in_bf16) return dot(d_act, act, n, [](float value) { return round_to_bf16(value); });
  }
  return dot(d_act, act, n);
}

}  // namespace

int64_t moe_experts_forward_workspace_bytes(int64_t rows, const MoeExpertDims& dims, int64_t element_bytes,
                                            int threads) {
  return (threads * forward_per_thread(dims, element_bytes) + rows * dims.hidden) * element_bytes;  // x_tile, u; out
}

int64_t moe_experts_backward_workspace_bytes(int64_t tokens, int64_t top_k, const MoeExpertDims& dims,
                                             int64_t element_bytes, int threads) {
  const int64_t dx_part = std::min(chunk_tokens_of(top_k), tokens) * top_k * dims.hidden;
  return (dx_part + threads * backward_per_thread(dims, element_bytes)) * element_bytes;
}

int64_t MoePlan::total_dropped() const { return std::accumulate(dropped.begin(), dropped.end(), int64_t{0}); }

void moe_plan_build(MoePlan& plan, const int32_t* index, int64_t tokens, int64_t top_k, int64_t experts,
                    int64_t capacity) {
  TRILLION_CHECK(tokens >= 0 && top_k >= 1 && experts >= 1, "moe plan tokens=", tokens, " top_k=", top_k,
                 " experts=", experts);
  const int64_t slots = tokens * top_k;
  TRILLION_CHECK(slots <= std::numeric_limits<int32_t>::max(), "moe plan: ", slots, " slots exceed int32");
  plan.tokens = tokens;
  plan.top_k = top_k;
  plan.experts = experts;
  plan.dropped.assign(experts, 0);
  plan.slot_row.assign(slots, -1);
  // Pass 1, slots in order (token ascending): each kept slot's position within its expert, held in
  // slot_row for now; beyond `capacity` the slot is dropped.
  std::vector<int64_t> kept(experts, 0);  // [E]
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = index[s];
    TRILLION_CHECK(e >= 0 && e < experts, "moe plan: index[", s / top_k, ", ", s % top_k, "] = ", e, " outside [0, ",
                   experts, ")");
    if (capacity > 0 && kept[e] >= capacity) {
      ++plan.dropped[e];
    } else {
      plan.slot_row[s] = static_cast<int32_t>(kept[e]++);
    }
  }
  plan.offsets.assign(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) plan.offsets[e + 1] = plan.offsets[e] + kept[e];
  // Pass 2: position → permuted row, and its inverse.
  plan.row_slot.assign(plan.rows(), 0);
  for (int64_t s = 0; s < slots; ++s) {
    if (plan.slot_row[s] < 0) continue;
    const int64_t row = plan.offsets[index[s]] + plan.slot_row[s];
    plan.slot_row[s] = static_cast<int32_t>(row);
    plan.row_slot[row] = static_cast<int32_t>(s);
  }
}

template <class T>
void moe_experts_forward(T* y, T* gate_up_out, T* act, const T* x, const T* gate_up, const T* down, const T* weight,
                         const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<T>& adapters) {
  check_plan(plan, dims);
  check_adapters(adapters, {}, dims);
  const int64_t H = dims.hidden, I = dims.intermediate, k = plan.top_k;
  // Items: (expert, first row of the tile, end of its range), chunk-major, then expert-major.
  const std::vector<int64_t> first = chunk_firsts(plan);
  const int64_t E = dims.experts, chunks = static_cast<int64_t>(first.size()) / E - 1;
  std::vector<int64_t> item_expert, item_row, item_end;
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r0 = first[c * E + e]; r0 < first[(c + 1) * E + e]; r0 += kTileRows) {
        item_expert.push_back(e);
        item_row.push_back(r0);
        item_end.push_back(first[(c + 1) * E + e]);
      }
  const int64_t per_thread = forward_per_thread(dims, sizeof(T));  // x_tile, u
  Buffer<T> workspace(per_thread * num_threads());
  Buffer<T> expert_out(plan.rows() * H);  // [rows, H] each row's output before its weight

  parallel_for_dynamic(static_cast<int64_t>(item_expert.size()), [&](int64_t item) {
    const int64_t e = item_expert[item], r0 = item_row[item];
    const int64_t m = std::min(kTileRows, item_end[item] - r0);
    T* x_tile = workspace.data() + per_thread * omp_get_thread_num();  // [m, H]
    T* u = x_tile + kTileRows * H;                                     // [m, r]
    for (int64_t i = 0; i < m; ++i) std::memcpy(x_tile + i * H, x + (plan.row_slot[r0 + i] / k) * H, H * sizeof(T));
    T* gu = gate_up_out + r0 * 2 * I;  // [m, 2I]
    T* a = act + r0 * I;               // [m, I]
    form_gate_up(gu, x_tile, m, gate_up + e * 2 * I * H, adapters, dims, e, u);
    form_act(a, gu, m, I);
    // expert_out[m, H] = a[m, I] · (down[e] + its adapter)[H, I]ᵀ
    T* out = expert_out.data() + r0 * H;  // [m, H]
    gemm<T>(false, true, m, H, I, T(1), a, I, down + e * H * I, I, T(0), out, H);
    for (const ExpertLoraPair<T>& pair : adapters.down) add_adapter(out, H, a, m, I, pair, e, u);
  });

  // Combine: y[t] += Σ_j weight[t, j] · expert_out[row of (t, j)], j in order, one thread per token.
  parallel_for(plan.tokens, k * H, [&](int64_t t) {
    T* y_row = y + t * H;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = plan.slot_row[t * k + j];
      if (row < 0) continue;
      const T w = weight[t * k + j];
      const T* out = expert_out.data() + row * H;
      for (int64_t h = 0; h < H; ++h) y_row[h] += w * out[h];
    }
  });
}

template <class T>
void moe_experts_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* x, const T* gate_up_out,
                          const T* act, const T* gate_up, const T* down, const T* weight, const MoePlan& plan,
                          const MoeExpertDims& dims, const ExpertAdapters<T>& adapters,
                          const ExpertAdapters<T>& adapter_grads) {
  check_plan(plan, dims);
  check_adapters(adapters, adapter_grads, dims);
  const int64_t N = plan.tokens, H = dims.hidden, I = dims.intermediate, E = dims.experts, k = plan.top_k;
  const int64_t M = kTileRows;
  // Token chunks of about kChunkRows slots, each expert's rows of chunk c one range.
  const int64_t chunk_tokens = chunk_tokens_of(k);
  const std::vector<int64_t> first = chunk_firsts(plan);  // [chunks + 1, E]
  const int64_t chunks = static_cast<int64_t>(first.size()) / E - 1;
  int64_t max_chunk_rows = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t rows = 0;
    for (int64_t e = 0; e < E; ++e) rows += first[(c + 1) * E + e] - first[c * E + e];
    max_chunk_rows = std::max(max_chunk_rows, rows);
  }
  Buffer<T> dx_part(max_chunk_rows * H);                         // [chunk rows, H]: d loss / d x of each row
  std::vector<int32_t> part_row(std::min(chunk_tokens, N) * k);  // [chunk slots]: the dx_part row of each slot
  std::vector<int64_t> base(E), order;                           // [E]: first dx_part row of each expert
  const int64_t per_thread = backward_per_thread(dims, sizeof(T));  // x_tile, d_out, d_act, d_gu, u, g, gu, act
  const bool act_in_bf16 = std::is_same_v<T, float> && matmul_precision() == MatmulPrecision::bf16;
  Buffer<T> workspace(per_thread * num_threads());

  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t0 = c * chunk_tokens, t1 = std::min(t0 + chunk_tokens, N);
    const int64_t* lo = first.data() + c * E;        // [E]: first row of each expert in this chunk
    const int64_t* hi = first.data() + (c + 1) * E;  // [E]: one past its last
    order.clear();
    for (int64_t e = 0, next = 0; e < E; ++e) {
      base[e] = next;
      next += hi[e] - lo[e];
      if (hi[e] > lo[e]) order.push_back(e);
    }
    // Experts with rows, largest first (the order only affects scheduling, never results).
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return hi[a] - lo[a] > hi[b] - lo[b]; });

    parallel_for_dynamic(static_cast<int64_t>(order.size()), [&](int64_t item) {
      const int64_t e = order[item];
      const T* gate_up_e = gate_up + e * 2 * I * H;                      // [2I, H]
      const T* down_e = down + e * H * I;                                // [H, I]
      T* x_tile = workspace.data() + per_thread * omp_get_thread_num();  // [M, H]
      T* d_out = x_tile + M * H;                                         // [M, H]
      T* d_act = d_out + M * H;                                          // [M, I]
      T* d_gu = d_act + M * I;                                           // [M, 2I]
      T* u = d_gu + M * 2 * I;                                           // [M, r]
      T* g = u + M * dims.adapter_rank;                                  // [M, r]
      T* gu_tile = g + M * dims.adapter_rank;                            // [M, 2I] rebuilt gate_up rows
      T* act_tile = gu_tile + M * 2 * I;                                 // [M, I] rebuilt act
      for (int64_t r0 = lo[e]; r0 < hi[e]; r0 += M) {
        const int64_t m = std::min(M, hi[e] - r0);
        T* dx_rows = dx_part.data() + (base[e] + r0 - lo[e]) * H;  // [m, H]
        for (int64_t i = 0; i < m; ++i) {
          const int64_t s = plan.row_slot[r0 + i], t = s / k;
          part_row[s - t0 * k] = static_cast<int32_t>(base[e] + r0 - lo[e] + i);
          std::memcpy(x_tile + i * H, x + t * H, H * sizeof(T));
          std::memcpy(d_out + i * H, dy + t * H, H * sizeof(T));
        }
        // The forward's gate_up rows and act, saved or formed again from the x rows as the forward did.
        const T* gu_rows = gate_up_out != nullptr ? gate_up_out + r0 * 2 * I : gu_tile;  // [m, 2I]
        if (gate_up_out == nullptr) form_gate_up(gu_tile, x_tile, m, gate_up_e, adapters, dims, e, u);
        const T* act_rows = act != nullptr ? act + r0 * I : act_tile;  // [m, I]
        if (act == nullptr) form_act(act_tile, gu_rows, m, I);
        // Unweighted: d_act[m, I] = dy rows[m, H] · (down[e] + its adapter)[H, I], and g = s · dy · B[e]
        gemm<T>(false, false, m, I, H, T(1), d_out, H, down_e, I, T(0), d_act, I);
        for (const ExpertLoraPair<T>& pair : adapters.down) adapter_input_grad(d_act, d_out, H, m, I, pair, e, g);
        // dweight = <dy[t], out[row]> = <d_act[row], act[row]>; then d_act, d_out (and g) take the weight.
        for (int64_t i = 0; i < m; ++i) {
          const int64_t s = plan.row_slot[r0 + i];
          dweight[s] = dot_with_act(d_act + i * I, act_rows + i * I, I, act_in_bf16);
          const T w = weight[s];
          for (int64_t j = 0; j < I; ++j) d_act[i * I + j] *= w;
          for (int64_t h = 0; h < H; ++h) d_out[i * H + h] *= w;
          if (!adapters.down.empty())
            for (int64_t j = 0; j < adapters.down[0].rank; ++j) g[i * adapters.down[0].rank + j] *= w;
        }
        for (size_t p = 0; p < adapters.down.size(); ++p)
          adapter_weight_grads(d_out, H, act_rows, m, I, adapters.down[p], grad_of(adapter_grads.down, p), e, u, g);
        for (int64_t i = 0; i < m; ++i) {
          const T* row = gu_rows + i * 2 * I;  // [2I] = [gate | up]
          swiglu_span_backward(d_gu + i * 2 * I, d_gu + i * 2 * I + I, d_act + i * I, row, row + I, I);
        }
        // dx_rows[m, H] = d_gu[m, 2I] · (gate_up[e] + its adapters)[2I, H]
        gemm<T>(false, false, m, H, 2 * I, T(1), d_gu, 2 * I, gate_up_e, H, T(0), dx_rows, H);
        for (size_t p = 0; p < adapters.gate_up.size(); ++p) {
          adapter_input_grad(dx_rows, d_gu, 2 * I, m, H, adapters.gate_up[p], e, g);
          adapter_weight_grads(d_gu, 2 * I, x_tile, m, H, adapters.gate_up[p], grad_of(adapter_grads.gate_up, p), e, u,
                               g);
        }
        // dgate_up[e][2I, H] += d_gu[m, 2I]ᵀ · x_tile[m, H];  ddown[e][H, I] += d_out[m, H]ᵀ · act[m, I]
        if (dgate_up != nullptr)
          gemm<T>(true, false, 2 * I, H, m, T(1), d_gu, 2 * I, x_tile, H, T(1), dgate_up + e * 2 * I * H, H);
        if (ddown != nullptr)
          gemm<T>(true, false, H, I, m, T(1), d_out, H, act_rows, I, T(1), ddown + e * H * I, I);
      }
    });

    // Per token: dweight[t, j] = 0 when dropped; dx[t] += Σ_j dx_part[row].
    parallel_for(t1 - t0, k * H, [&](int64_t i) {
      const int64_t t = t0 + i;
      T* dx_row = dx + t * H;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = t * k + j, row = plan.slot_row[s];
        if (row < 0) {
          dweight[s] = T(0);
          continue;
        }
        const T* part = dx_part.data() + int64_t(part_row[s - t0 * k]) * H;
        for (int64_t h = 0; h < H; ++h) dx_row[h] += part[h];
      }
    });
  }
}

#define TRILLION_INSTANTIATE_MOE_EXPERTS(T)                                                                         \
  template void moe_experts_forward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const MoePlan&,          \
                                       const MoeExpertDims&, const ExpertAdapters<T>&);                             \
  template void moe_experts_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                        const T*, const MoePlan&, const MoeExpertDims&, const ExpertAdapters<T>&,   \
                                        const ExpertAdapters<T>&);
TRILLION_INSTANTIATE_MOE_EXPERTS(float)
TRILLION_INSTANTIATE_MOE_EXPERTS(double)
#undef TRILLION_INSTANTIATE_MOE_EXPERTS

}  // namespace trillion
