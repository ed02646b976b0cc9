// The routed experts of an MoE layer: permute tokens by expert, one grouped GEMM with gate and up
// fused and SwiGLU applied in the same pass, the down projection, and the weighted combine.
//
//   for each kept slot (t, j), e = index[t, j]:
//     gu        = x[t] · gate_up[e]ᵀ                    gate_up [E, 2I, H]: gate rows, then up rows
//     act       = silu(gu[:I]) · gu[I:]
//     out       = act · down[e]ᵀ                         down [E, H, I]
//     y[t]     += weight[t, j] · out                    j = 0..k−1 in order (owner computes)
//
// A slot is (token t, choice j), numbered t·k + j. The plan groups the kept slots by expert
// (expert-major, token ascending within an expert: stable). Dropless when capacity ≤ 0; otherwise
// each expert keeps its first `capacity` slots in token order and drops the rest (later positions
// first, as GShard does); a dropped slot contributes nothing and gets weight gradient 0.
//
// A token may name the same expert in several of its k choices; each slot is then its own row.
//
// Forward saves, per permuted row (rows = plan.rows(), in plan order), gate_up_out [rows, 2I]
// (pre-activation) and act [rows, I]; the caller allocates them once the plan is built (dropless:
// rows = N · k). The rows' outputs before weighting live only in the forward: the combine weight's
// gradient <dy[t], out> is formed in the backward as <dy[t] · down[e], act>, from the d_act rows the
// backward computes anyway, so they are never saved. The forward
// runs all experts in one parallel region over (expert, row tile) items, the backward one region per
// chunk of tokens over experts (weight gradients of an expert accumulate on one thread in a fixed
// order); every output row is summed by one thread in a fixed order, so results do not depend on the
// thread count. The backward allocates its own workspace: the input-gradient rows of one token chunk
// (about 8192 slots × H) and per-thread tiles.
//
// LoRA on the routed experts (model/lora_config.h): ExpertAdapters' pairs add scaling · B[e] · A[e]
// to rows row0 .. row0 + rows of expert e's gate_up or down, applied through the rank on the same
// row tiles as the expert's GEMMs: forward gu[:, row0:] += s · (x_tile · A[e]ᵀ) · B[e]ᵀ, and the same
// after the down GEMM on act; backward recomputes u = x_tile · A[e]ᵀ [m, r], forms g = s · d · B[e]
// [m, r] from the slice's output gradient d, adds g · A[e] to the input gradient and accumulates
// dB[e] += s · dᵀ · u, dA[e] += gᵀ · x_tile, on the expert's one thread. No ΔW is formed.
// Gradient rule: dx accumulates (+=); dweight is written (=); dw_gate_up, dw_down and the adapters'
// gradients accumulate (+=).
#pragma once

#include <cstdint>
#include <vector>

namespace trillion {

struct MoePlan {
  int64_t tokens = 0, top_k = 0, experts = 0;
  std::vector<int64_t> offsets;   // [E + 1]: permuted rows offsets[e] .. offsets[e+1] belong to expert e
  std::vector<int32_t> row_slot;  // [rows]: the slot t·k + j of each permuted row
  std::vector<int32_t> slot_row;  // [N · k]: the permuted row of each slot, −1 when dropped
  std::vector<int64_t> dropped;   // [E]: slots dropped by the capacity limit
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t total_dropped() const;
};

// Builds the plan from index[N, k] (values in [0, E)).
void moe_plan_build(MoePlan& plan, const int32_t* index, int64_t tokens, int64_t top_k, int64_t experts,
                    int64_t capacity);

struct MoeExpertDims {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (expert width)
  int64_t experts = 0;       // E
  int64_t adapter_rank = 0;  // the largest rank of the adapters it may carry (their workspace); 0: none
};

// A LoRA pair on the experts' stacked weight W [E, out, in]: expert e's rows row0 .. row0 + rows
// gain scaling · B[e] · A[e]. A pair of gradients has the same shape (rank, rows and scaling unused).
template <class T>
struct ExpertLoraPair {
  T* a = nullptr;  // [E, rank, in]
  T* b = nullptr;  // [E, rows, rank]
  int64_t rank = 0;
  int64_t row0 = 0, rows = 0;
  double scaling = 0.0;
};

// The adapters of one layer's routed experts, each list in the same order as its gradients'.
template <class T>
struct ExpertAdapters {
  std::vector<ExpertLoraPair<T>> gate_up;  // none; one on all 2I rows (fused); or gate's and up's I rows each
  std::vector<ExpertLoraPair<T>> down;     // none, or one on all H rows
  bool empty() const { return gate_up.empty() && down.empty(); }
};

// y[N, H] += combined expert outputs; gate_up_out [rows, 2I] and act [rows, I] saved.
template <class T>
void moe_experts_forward(T* y, T* gate_up_out, T* act, const T* x, const T* gate_up, const T* down, const T* weight,
                         const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<T>& adapters = {});

// dx[N, H] (+=), dweight[N, k] (=), dgate_up [E, 2I, H] (+=), ddown [E, H, I] (+=) from dy[N, H].
// A null dgate_up / ddown skips that weight gradient (frozen experts); `adapter_grads` holds the
// gradients of `adapters`' pairs, in their order. A null gate_up_out or act (not saved) is formed
// again inside each row tile, from the x rows the tile gathers anyway, as the forward formed it: one
// more gate/up product per tile (gate_up_out) or one more SwiGLU (act), and no rows saved.
template <class T>
void moe_experts_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* x, const T* gate_up_out,
                          const T* act, const T* gate_up, const T* down, const T* weight, const MoePlan& plan,
                          const MoeExpertDims& dims, const ExpertAdapters<T>& adapters = {},
                          const ExpertAdapters<T>& adapter_grads = {});

// The bytes of moe_experts_forward's and moe_experts_backward's temporaries (Buffers of T: the
// per-thread tiles at `threads` threads, with the adapters' rank columns; the forward's outputs of
// `rows` rows; the backward's dx_part at its dropless bound, one chunk of min(N, 8192 / k) tokens ·
// k rows), for the memory plan.
int64_t moe_experts_forward_workspace_bytes(int64_t rows, const MoeExpertDims& dims, int64_t element_bytes,
                                            int threads);
int64_t moe_experts_backward_workspace_bytes(int64_t tokens, int64_t top_k, const MoeExpertDims& dims,
                                             int64_t element_bytes, int threads);

}  // namespace trillion
