// `trillion bench tiles`: the engine's per-tile products on one thread, as its kernels call them
// inside their parallel regions (attention's and MLA's score and value tiles, the chunked delta
// rule's products, expert row tiles), on the engine's gemm and gemm_bf16 (ops/gemm.h: oneDNN
// unless --gemm says otherwise) against libxsmm's JIT small-matrix kernels (Debian's libxsmm-dev,
// 1.17; its target follows the CPU, or LIBXSMM_TARGET, not TRILLION_ISA), in fp32 and with bf16
// operands and float accumulation: the measurement that chooses where libxsmm serves (issue 23,
// docs/benchmarks.md).
//
// libxsmm's kernels are column-major, so a row-major C[m, n] = A · op(B) runs as Cᵀ = op(B)ᵀ · Aᵀ
// with op(B) first: a product with a transposed right factor (q · kᵀ, x · wᵀ) needs a kernel whose
// first operand is transposed, which is asked for and reported as none where libxsmm has none. Its
// bf16 kernels read the first operand in VNNI pairs (two consecutive k per element pair), which
// this benchmark packs once outside the timing, as a weight's copy would be packed once per step.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

namespace trillion {

struct TileBenchOptions {
  int runs = 10;  // timed runs per path (after one warm-up); fewer are for smoke tests only
  double min_flops_per_run = 2e7;  // each run repeats the product until it does this much work
};

// Calls emit for each shape (one JSON object: its sizes, each path's GFLOP/s, libxsmm over oneDNN
// per precision or null where libxsmm has no kernel, and each path's max relative error against
// the double product of its operands) and returns the summary: the shapes where libxsmm is faster,
// per precision, and libxsmm's target.
nlohmann::json run_tile_bench(const TileBenchOptions& options, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace trillion
