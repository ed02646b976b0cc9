// AdamW step (torch.optim.AdamW semantics: decoupled decay, bias correction) and the pieces of
// global gradient-norm clipping, each one parallel pass over blocks of the spans. Element updates
// are independent; the sum of squares adds per-block partial sums in block order, fixed by the spans.
#include "ops/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/lane_sum.h"
#include "core/parallel.h"

namespace trillion {

namespace {

// Blocks of at most kBlock elements, never crossing a span: the parallel items of both passes.
struct Block {
  int64_t begin, end;  // elements [begin, end) of the flat buffers
  bool decay;
};
constexpr int64_t kBlock = int64_t{1} << 15;

std::vector<Block> blocks_of(const std::vector<AdamWSpan>& spans) {
  std::vector<Block> blocks;
  for (const AdamWSpan& s : spans)
    for (int64_t b = s.offset; b < s.offset + s.count; b += kBlock)
      blocks.push_back({b, std::min(b + kBlock, s.offset + s.count), s.decay});
  return blocks;
}

// The work per item that parallel_for weighs: the blocks' mean length (at least 1).
int64_t mean_block_length(const std::vector<Block>& blocks) {
  int64_t elements = 0;
  for (const Block& b : blocks) elements += b.end - b.begin;
  return blocks.empty() ? 1 : std::max<int64_t>(1, elements / static_cast<int64_t>(blocks.size()));
}

}  // namespace

template <class T>
void adamw_step(T* p, T* m, T* v, const T* g, const std::vector<AdamWSpan>& spans, int64_t step,
                const AdamWHyper& hyper, double grad_scale) {
  TRILLION_CHECK(step >= 1, "adamw step must be 1-based, got ", step);
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  const double step_size = hyper.lr / bias1;
  const double inv_sqrt_bias2 = 1.0 / std::sqrt(bias2);
  const std::vector<Block> blocks = blocks_of(spans);
  parallel_for(static_cast<int64_t>(blocks.size()), mean_block_length(blocks), [&](int64_t b) {
    const Block& block = blocks[b];
    // In T, as torch.optim.AdamW computes a float32 tensor's update. Local restrict pointers and
    // constants: the stores cannot alias what the loop reads, so it vectorizes (through the lambda's
    // by-reference captures the compiler must assume they might).
    T* __restrict pb = p + block.begin;
    T* __restrict mb = m + block.begin;
    T* __restrict vb = v + block.begin;
    const T* __restrict gb = g + block.begin;
    const T b1 = static_cast<T>(hyper.beta1), b2 = static_cast<T>(hyper.beta2);
    const T c1 = static_cast<T>(1.0 - hyper.beta1), c2 = static_cast<T>(1.0 - hyper.beta2);
    const T s = static_cast<T>(grad_scale), lr = static_cast<T>(step_size), e = static_cast<T>(hyper.eps);
    const T inv = static_cast<T>(inv_sqrt_bias2);
    const T decay_factor = static_cast<T>(block.decay ? 1.0 - hyper.lr * hyper.weight_decay : 1.0);
    for (int64_t i = 0; i < block.end - block.begin; ++i) {  // p, m, v, g: element i of the block
      const T grad = gb[i] * s;
      const T m_new = b1 * mb[i] + c1 * grad;
      const T v_new = b2 * vb[i] + c2 * grad * grad;
      mb[i] = m_new;
      vb[i] = v_new;
      pb[i] = pb[i] * decay_factor - lr * m_new / (std::sqrt(v_new) * inv + e);
    }
  });
}

template <class T>
double sum_of_squares(const T* g, const std::vector<AdamWSpan>& spans) {
  const std::vector<Block> blocks = blocks_of(spans);
  std::vector<double> partial(blocks.size());  // [blocks]
  parallel_for(static_cast<int64_t>(blocks.size()), mean_block_length(blocks), [&](int64_t b) {
    const T* __restrict gb = g + blocks[b].begin;  // [block length]
    partial[b] = lane_sum(blocks[b].end - blocks[b].begin, [&](int64_t i) {
      return static_cast<double>(gb[i]) * static_cast<double>(gb[i]);
    });
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

double clip_factor(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

#define TRILLION_INSTANTIATE_ADAMW(T)                                                                   \
  template void adamw_step<T>(T*, T*, T*, const T*, const std::vector<AdamWSpan>&, int64_t, const AdamWHyper&, \
                              double);                                                                  \
  template double sum_of_squares<T>(const T*, const std::vector<AdamWSpan>&);
TRILLION_INSTANTIATE_ADAMW(float)
TRILLION_INSTANTIATE_ADAMW(double)
#undef TRILLION_INSTANTIATE_ADAMW

}  // namespace trillion
