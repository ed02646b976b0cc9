// The short causal convolution of linear-attention layers (ops/conv1d.h: Gated DeltaNet's conv over
// [q | k | v], KDA's q/k/v convs) over sequences split by context parallelism
// (parallel/context_parallel.h, docs/architecture.md "Context parallelism").
//
// A chunk's first W − 1 outputs read the W − 1 inputs before it (its halo), which other ranks hold.
// Every rank all-gathers the last W − 1 inputs of each of its chunks (its chunks' tails), builds each
// of its chunks as one segment [halo | chunk] of the kernel (positions before 0 left out), runs the
// kernel and keeps the chunk's outputs. The backward forms the same segments again (the tails
// gathered again: nothing is kept between the passes), runs the kernel's backward with zero output
// gradients on the halo, and all-gathers each chunk's halo input gradients, which the ranks holding
// those tokens add to theirs. Document masks (doc_start, global positions) cut a segment where a
// document starts, in the halo too (a chunk whose first token's document starts inside its halo
// reads the halo from there on).
#pragma once

#include <cstdint>

#include "ops/conv1d.h"
#include "parallel/context_parallel.h"

namespace trillion {

// The bytes a rank receives, forward (the other ranks' chunk tails) and backward (the tails again and
// the other ranks' chunks' halo gradients), for local sizes (batch, channels, width).
// What the forward and the backward cost `rank` in a step (the memory plan's ContextPlan): the
// gathered tails, the extended rows and their outputs or gradients, the kernel's temporaries and the
// halos' gradients at their peak, and the traffic above.
ContextCost context_conv1d_cost(const ContextSplit& split, int rank, const Conv1dSizes& local, int64_t element_bytes);

ContextPassTraffic context_conv1d_traffic(const ContextSplit& split, const Conv1dSizes& local,
                                               int64_t element_bytes);

// y [B, local, C] from x [B, local, C] and w [C, W]; local.seq_len = split.local_len(rank), no
// cu_seqlens (the split's chunks and doc_start [B, local] make the segments, or null: none).
template <class T>
void context_conv1d_silu_forward(T* y, const T* x, const T* w, const int32_t* doc_start, const Conv1dSizes& local,
                                 const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic);

// dx [B, local, C] written (=), dw [C, W] accumulated (+=: this rank's terms; null: frozen).
template <class T>
void context_conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* doc_start,
                                  const Conv1dSizes& local, const ContextSplit& split, const ProcessGroup& group,
                                  ContextTraffic* traffic);

}  // namespace trillion
