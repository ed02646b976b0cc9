// Causal depthwise conv1d + SiLU: forward, backward and decode. See conv1d.h.
#include "ops/conv1d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "ops/activation.h"

namespace trillion {
namespace {

constexpr int64_t kChannelBlock = 16;  // channels per thread task of the dw sum
constexpr int64_t kSigmoidChunk = 64;  // channels whose σ is computed at once (on the stack)

// The first token of each token's segment, [B · T] (row starts, or cu_seqlens), checked.
std::vector<int64_t> segment_starts(const int32_t* cu_seqlens, const Conv1dSizes& s) {
  TRILLION_CHECK(s.batch >= 1 && s.seq_len >= 0 && s.channels >= 1 && s.width >= 1, "conv1d sizes B=", s.batch,
                 " T=", s.seq_len, " C=", s.channels, " W=", s.width);
  std::vector<int64_t> start(s.batch * s.seq_len);  // [B · T]
  if (cu_seqlens == nullptr) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = 0; t < s.seq_len; ++t) start[b * s.seq_len + t] = b * s.seq_len;
    return start;
  }
  TRILLION_CHECK(s.batch == 1 && s.num_segments >= 1 && cu_seqlens[0] == 0 && cu_seqlens[s.num_segments] == s.seq_len,
                 "conv1d cu_seqlens must start at 0 and end at T = ", s.seq_len, " with batch 1");
  for (int64_t n = 0; n < s.num_segments; ++n) {
    TRILLION_CHECK(cu_seqlens[n] <= cu_seqlens[n + 1], "conv1d cu_seqlens decreases at ", n);
    for (int64_t t = cu_seqlens[n]; t < cu_seqlens[n + 1]; ++t) start[t] = cu_seqlens[n];
  }
  return start;
}

// a[C] of token p (flat over B · T): the window over x, zero before `first`.
template <class T>
void pre_activation(T* a, const T* x, const T* w, int64_t p, int64_t first, int64_t C, int64_t W) {
  for (int64_t c = 0; c < C; ++c) a[c] = T(0);
  for (int64_t j = 0; j < W; ++j) {
    const int64_t src = p - W + 1 + j;
    if (src < first) continue;
    const T* row = x + src * C;  // [C]
    for (int64_t c = 0; c < C; ++c) a[c] += w[c * W + j] * row[c];
  }
}

// a[C] ← a · σ(a).
template <class T>
void silu_in_place(T* a, int64_t C) {
  for (int64_t c0 = 0; c0 < C; c0 += kSigmoidChunk) {
    const int64_t m = std::min(kSigmoidChunk, C - c0);
    T sig[kSigmoidChunk];  // [m] σ(a)
    sigmoid_span(sig, a + c0, m);
    for (int64_t c = 0; c < m; ++c) a[c0 + c] *= sig[c];
  }
}

}  // namespace

template <class T>
void conv1d_silu_forward(T* y, const T* x, const T* w, const int32_t* cu_seqlens, const Conv1dSizes& s) {
  const std::vector<int64_t> start = segment_starts(cu_seqlens, s);
  const int64_t C = s.channels, W = s.width;
  parallel_for(s.batch * s.seq_len, C * W, [&](int64_t p) {
    T* out = y + p * C;  // [C]
    pre_activation(out, x, w, p, start[p], C, W);
    silu_in_place(out, C);
  });
}

int64_t conv1d_silu_backward_workspace_bytes(int64_t tokens, int64_t channels, int64_t width, int64_t element_bytes) {
  const int64_t block_sums = (channels + kChannelBlock - 1) / kChannelBlock * width * kChannelBlock;
  return (tokens * channels + block_sums) * element_bytes;  // da, the dw block sums
}

template <class T>
void conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* cu_seqlens,
                          const Conv1dSizes& s) {
  const std::vector<int64_t> start = segment_starts(cu_seqlens, s);
  const int64_t P = s.batch * s.seq_len, C = s.channels, W = s.width;
  Buffer<T> da(P * C);  // [B · T, C] gradient wrt the pre-activation
  parallel_for(P, C * W, [&](int64_t p) {
    T* d = da.data() + p * C;  // [C]
    pre_activation(d, x, w, p, start[p], C, W);
    for (int64_t c0 = 0; c0 < C; c0 += kSigmoidChunk) {
      const int64_t m = std::min(kSigmoidChunk, C - c0);
      T sig[kSigmoidChunk];  // [m] σ(a)
      sigmoid_span(sig, d + c0, m);
      for (int64_t c = 0; c < m; ++c) {  // silu'(a) = σ(a)(1 + a(1 − σ(a)))
        d[c0 + c] = dy[p * C + c0 + c] * sig[c] * (T(1) + d[c0 + c] * (T(1) - sig[c]));
      }
    }
  });
  // dx[p] = Σ_j w[:, j] · da[p + W − 1 − j], over outputs of the same segment (gather: owner computes).
  parallel_for(P, C * W, [&](int64_t p) {
    T* out = dx + p * C;  // [C]
    for (int64_t c = 0; c < C; ++c) out[c] = T(0);
    for (int64_t j = 0; j < W; ++j) {
      const int64_t dst = p + W - 1 - j;
      if (dst >= P || start[dst] > p) continue;  // past the end, or in a later segment (which reads zeros)
      const T* d = da.data() + dst * C;          // [C]
      for (int64_t c = 0; c < C; ++c) out[c] += w[c * W + j] * d[c];
    }
  });
  if (dw == nullptr) return;
  // dw[c, j] += Σ_p da[p, c] · x[p − W + 1 + j, c], each channel summed by one thread in token order;
  // threads take blocks of channels and walk the tokens row by row (contiguous in c).
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
  Buffer<T> sums(blocks * W * kChannelBlock);  // [blocks, W, kChannelBlock]
  parallel_for(blocks, P * W * kChannelBlock, [&](int64_t block) {
    const int64_t c0 = block * kChannelBlock, width = std::min(kChannelBlock, C - c0);
    T* sum = sums.data() + block * W * kChannelBlock;  // [W, kChannelBlock]
    std::fill(sum, sum + W * kChannelBlock, T(0));
    for (int64_t p = 0; p < P; ++p) {
      const T* d = da.data() + p * C + c0;  // [width]
      for (int64_t j = 0; j < W; ++j) {
        const int64_t src = p - W + 1 + j;
        if (src < start[p]) continue;
        const T* in = x + src * C + c0;  // [width]
        T* acc = sum + j * kChannelBlock;  // [width]
        for (int64_t c = 0; c < width; ++c) acc[c] += d[c] * in[c];
      }
    }
    for (int64_t c = 0; c < width; ++c)
      for (int64_t j = 0; j < W; ++j) dw[(c0 + c) * W + j] += sum[j * kChannelBlock + c];
  });
}

template <class T>
void conv1d_silu_decode(T* y, T* history, const T* x, const T* w, int64_t n, const Conv1dSizes& s) {
  const int64_t C = s.channels, W = s.width;
  TRILLION_CHECK(n >= 1 && W >= 1, "conv1d decode of ", n, " tokens, width ", W);
  parallel_for(s.batch, n * C * W, [&](int64_t b) {
    T* window = history + b * (W - 1) * C;  // [W − 1, C] oldest first
    for (int64_t t = 0; t < n; ++t) {
      const T* in = x + (b * n + t) * C;  // [C]
      T* out = y + (b * n + t) * C;       // [C]
      for (int64_t c = 0; c < C; ++c) {
        T a = w[c * W + W - 1] * in[c];
        for (int64_t j = 0; j + 1 < W; ++j) a += w[c * W + j] * window[j * C + c];
        out[c] = a;
      }
      silu_in_place(out, C);
      for (int64_t j = 0; j + 2 < W; ++j)  // shift the window by one token
        for (int64_t c = 0; c < C; ++c) window[j * C + c] = window[(j + 1) * C + c];
      if (W > 1)
        for (int64_t c = 0; c < C; ++c) window[(W - 2) * C + c] = in[c];
    }
  });
}

#define TRILLION_INSTANTIATE(T)                                                                                   \
  template void conv1d_silu_forward<T>(T*, const T*, const T*, const int32_t*, const Conv1dSizes&);               \
  template void conv1d_silu_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, const Conv1dSizes&); \
  template void conv1d_silu_decode<T>(T*, T*, const T*, const T*, int64_t, const Conv1dSizes&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
