// Plain MoE router: one token at a time, the decision made by fully ranking every candidate with a
// stable sort (score descending; the stable sort keeps index order among equal scores), the weights
// gathered and renormalized in the textbook way, and their backward through an explicit k×k
// Jacobian. It is the test oracle of the fused kernels in ops/moe_router.h, with the same
// arguments, the same semantics and the same gradient rule (dscores accumulated).
#pragma once

#include <cstdint>

#include "ops/moe_router.h"

namespace trillion {

// index[N, k] ← the routing decision of router_select; bias[E] may be null.
template <class T>
void router_select_ref(int32_t* index, const T* scores, const T* bias, int64_t tokens, const RouterDims& dims);

// weight[N, k] ← gathered, optionally renormalized and scaled scores[N, E].
template <class T>
void router_weights_forward_ref(T* weight, const T* scores, const int32_t* index, int64_t tokens,
                                const RouterDims& dims);

// dscores[N, E] += Jᵀ · dweight[N, k], J[i, m] = d weight_i / d scores[idx_m] built per token.
template <class T>
void router_weights_backward_ref(T* dscores, const T* dweight, const T* scores, const int32_t* index,
                                 int64_t tokens, const RouterDims& dims);

}  // namespace trillion
