// The short causal depthwise convolution of linear-attention layers (Gated DeltaNet's conv1d over
// [q | k | v], Kimi Delta Attention's q/k/v convs), with the SiLU that follows it:
//
//   y[t, c] = silu(a[t, c]),  a[t, c] = Σ_{j=0..W−1} w[c, j] · x[t − W + 1 + j, c]
//
// (transformers: F.conv1d(padding = W − 1, groups = C)[..., :T], weight [C, 1, W], no bias).
// Positions before the start of a token's segment read as zero, so the window resets at every
// segment start (rows of the batch, or fla's cu_seqlens over packed tokens, as in ops/delta_rule.h);
// a decode step instead reads the carried window `history` of the last W − 1 inputs.
//
// Layouts: x, y, dx, dy [B, T, C] (token-major, channels inside); w, dw [C, W]; history
// [B, W − 1, C] (oldest first). Forward saves nothing (backward recomputes a from x).
// Gradient rule: dx is written (=); dw accumulates (+=). Work items are output rows (forward,
// input gradient) and channels (weight gradient, summed over tokens in order): results do not
// depend on the thread count.
#pragma once

#include <cstdint>

namespace trillion {

struct Conv1dSizes {
  int64_t batch = 1;         // B (1 when cu_seqlens is given)
  int64_t seq_len = 0;       // T per row (packed: all tokens)
  int64_t channels = 0;      // C
  int64_t width = 0;         // W, the kernel size (linear_conv_kernel_dim)
  int64_t num_segments = 0;  // N when cu_seqlens [N + 1] is given; ignored otherwise
};

// y[B, T, C] from x[B, T, C], w[C, W]; cu_seqlens [N + 1] or null (each row one segment).
template <class T>
void conv1d_silu_forward(T* y, const T* x, const T* w, const int32_t* cu_seqlens, const Conv1dSizes& sizes);

// dx[B, T, C] (=), dw[C, W] (+=; null: frozen) from dy[B, T, C] and the forward's inputs.
template <class T>
void conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* cu_seqlens,
                          const Conv1dSizes& sizes);
// The bytes of conv1d_silu_backward's temporaries (the pre-activation gradient [tokens, channels]
// and the dw sums of channel blocks, of T), for the memory plan; the forward and decode have none.
int64_t conv1d_silu_backward_workspace_bytes(int64_t tokens, int64_t channels, int64_t width, int64_t element_bytes);

// Decoding, batch rows of n new tokens each: y[B, n, C] from x[B, n, C] after the window
// history[B, W − 1, C], which is advanced in place to the last W − 1 inputs.
template <class T>
void conv1d_silu_decode(T* y, T* history, const T* x, const T* w, int64_t n, const Conv1dSizes& sizes);

}  // namespace trillion
