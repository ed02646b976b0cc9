// Two plain versions of the routed experts (ops/moe_experts.h), same math and layouts:
//
//  * the ORACLE (moe_oracle_*): a loop over tokens and each token's kept choices, plain scalar loops,
//    no BLAS, no permutation. It decides the capacity drops itself from index (each expert keeps its
//    first `capacity` slots t·k + j in slot order; capacity ≤ 0 keeps all), so it also checks the
//    plan. It is the test oracle; it is slow.
//  * the FRAGMENTED path (moe_fragmented_*): the experts as a framework composes them from small
//    ops, one expert at a time, every intermediate materialized in its own buffer: gather the
//    expert's token rows, GEMM with gate_up[e], split gate and up, SwiGLU as its own pass, GEMM with
//    down[e], scale by the routing weights and scatter-add into y. Matrix products are
//    multi-threaded BLAS calls on whole experts. It takes the MoePlan (the framework's sort) and
//    saves what autograd would save (MoeFragmentedSaved). It is the baseline of `trillion bench moe`.
//
// Shapes: x, y, dx, dy [N, H]; gate_up, dgate_up [E, 2I, H] (gate rows, then up rows); down, ddown
// [E, H, I]; weight, dweight [N, k]; index [N, k].
// Gradient rule (as the fused op): dx accumulates (+=); dweight is written (=; 0 for dropped slots);
// dgate_up and ddown accumulate (+=). A null dgate_up / ddown skips that gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "ops/moe_experts.h"

namespace trillion {

// y[N, H] += Σ over kept (t, j) of weight[t, j] · down[e] · swiglu(gate_up[e] · x[t]).
template <class T>
void moe_oracle_forward(T* y, const T* x, const T* gate_up, const T* down, const T* weight, const int32_t* index,
                        int64_t tokens, int64_t top_k, int64_t capacity, const MoeExpertDims& dims);

// Recomputes each kept slot's forward and writes / accumulates the gradients from dy[N, H].
template <class T>
void moe_oracle_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* x, const T* gate_up,
                         const T* down, const T* weight, const int32_t* index, int64_t tokens, int64_t top_k,
                         int64_t capacity, const MoeExpertDims& dims);

// What the fragmented forward keeps for its backward, per expert e with n_e = plan rows of e.
template <class T>
struct MoeFragmentedSaved {
  std::vector<Buffer<T>> x;       // [E] × [n_e, H]: gathered input rows
  std::vector<Buffer<T>> gate;    // [E] × [n_e, I]
  std::vector<Buffer<T>> up;      // [E] × [n_e, I]
  std::vector<Buffer<T>> act;     // [E] × [n_e, I]: silu(gate) · up
  std::vector<Buffer<T>> out;     // [E] × [n_e, H]: expert output before weighting
  std::vector<Buffer<T>> weight;  // [E] × [n_e]: gathered routing weights
};

// y[N, H] += the weighted expert outputs; fills saved.
template <class T>
void moe_fragmented_forward(T* y, MoeFragmentedSaved<T>& saved, const T* x, const T* gate_up, const T* down,
                            const T* weight, const MoePlan& plan, const MoeExpertDims& dims);

// dx (+=), dweight (=), dgate_up (+=), ddown (+=) from dy[N, H] and the saved tensors.
template <class T>
void moe_fragmented_backward(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const MoeFragmentedSaved<T>& saved,
                             const T* gate_up, const T* down, const MoePlan& plan, const MoeExpertDims& dims);

}  // namespace trillion
