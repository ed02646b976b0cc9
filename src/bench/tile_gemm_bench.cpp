// `trillion bench tiles` (see tile_gemm_bench.h).
#include "bench/tile_gemm_bench.h"

#include <libxsmm.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "bench/timing.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

// A row-major product C[m, n] = A[m, k] · op(B) of one kernel's tile, op(B) = Bᵀ with B [n, k]
// when trans_b, else B [k, n].
struct TileShape {
  const char* name;
  int64_t m, n, k;
  bool trans_b;
};

// Attention tiles (64 queries × 64 keys, head dim 64 or MLA's 192 / 128), the delta rule's chunk
// products (chunk 64, head dims 64 and 128), expert row tiles (rows × intermediate × hidden).
constexpr TileShape kShapes[] = {
    {"attention scores q·kT 64x64x64", 64, 64, 64, true},  {"attention values p·v 64x64x64", 64, 64, 64, false},
    {"MLA scores q·kT 64x64x192", 64, 64, 192, true},      {"MLA values p·v 64x128x64", 64, 128, 64, false},
    {"delta rule chunk 64x128x64", 64, 128, 64, false},    {"delta rule chunk k·kT 64x64x128", 64, 64, 128, true},
    {"expert rows x·wT 128x256x512", 128, 256, 512, true}, {"expert rows 128x256x512", 128, 256, 512, false},
    {"expert rows 256x768x256", 256, 768, 256, false},     {"expert rows 32x512x256", 32, 512, 256, false},
};

// One shape's operands, in float and rounded to bf16, and the double products they define.
struct TileProblem {
  TileShape shape;
  std::vector<float> a, b, c;      // [m, k], op(B)'s storage, [m, n]
  std::vector<bf16> a16, b16, b_vnni;  // the same rounded; b_vnni: op(B)ᵀ in VNNI pairs (libxsmm's first operand)

  explicit TileProblem(const TileShape& s) : shape(s), a(s.m * s.k), b(s.k * s.n), c(s.m * s.n) {
    const CounterRng rng(7, "bench_tiles");
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(rng.normal(i));
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(rng.normal(a.size() + i));
    a16.resize(a.size());
    b16.resize(b.size());
    to_bf16(a.data(), a16.data(), static_cast<int64_t>(a.size()));
    to_bf16(b.data(), b16.data(), static_cast<int64_t>(b.size()));
    if (s.trans_b || s.k % 2 != 0) return;
    // op(B)ᵀ column-major is B [k, n] row-major; its VNNI form pairs k: [k / 2][n][2].
    b_vnni.resize(b.size());
    for (int64_t p = 0; p < s.k; ++p)
      for (int64_t j = 0; j < s.n; ++j) b_vnni[(p / 2) * 2 * s.n + j * 2 + p % 2] = b16[p * s.n + j];
  }
  double flops() const { return 2.0 * double(shape.m) * double(shape.n) * double(shape.k); }
  int64_t ldb() const { return shape.trans_b ? shape.k : shape.n; }
  double b_at(int64_t p, int64_t j, bool rounded) const {  // op(B)[p, j]
    const int64_t i = shape.trans_b ? j * shape.k + p : p * shape.n + j;
    return rounded ? double(to_float(b16[i])) : double(b[i]);
  }
  // max |c − C| / max |C| against the double product of the operands (rounded: their bf16 values).
  double rel_err(bool rounded) const {
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < shape.m; ++i) {
      for (int64_t j = 0; j < shape.n; ++j) {
        double ref = 0.0;
        for (int64_t p = 0; p < shape.k; ++p)
          ref += (rounded ? double(to_float(a16[i * shape.k + p])) : double(a[i * shape.k + p])) * b_at(p, j, rounded);
        max_diff = std::max(max_diff, std::abs(double(c[i * shape.n + j]) - ref));
        max_ref = std::max(max_ref, std::abs(ref));
      }
    }
    return max_diff / std::max(max_ref, 1e-30);
  }
};

struct PathResult {
  double gflops = 0.0;
  double rel_err = 0.0;
};

// Times `product` (repeated to do at least min_flops of work per run) and checks its last result.
template <class Fn>
PathResult measure(TileProblem& p, const TileBenchOptions& o, bool rounded, const Fn& product) {
  const int repeats = std::max(1, static_cast<int>(o.min_flops_per_run / p.flops()));
  const auto run = [&] {
    for (int r = 0; r < repeats; ++r) product();
  };
  const TimingResult t = time_median(run, 1, o.runs);
  return {p.flops() * repeats / t.median_s * 1e-9, p.rel_err(rounded)};
}

nlohmann::json path_json(const std::optional<PathResult>& r) {
  if (!r) return nullptr;
  return {{"gflops", r->gflops}, {"max_rel_err", r->rel_err}};
}

}  // namespace

nlohmann::json run_tile_bench(const TileBenchOptions& o, const std::function<void(const nlohmann::json&)>& emit) {
  if (o.runs < 1 || !(o.min_flops_per_run > 0.0)) fail("bench tiles: --runs must be ≥ 1");
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(1);  // one thread, as inside a kernel's region
  libxsmm_init();
  const MatmulPrecisionScope fp32_products(MatmulPrecision::fp32);
  nlohmann::json fp32_wins = nlohmann::json::array(), bf16_wins = nlohmann::json::array();
  for (const TileShape& s : kShapes) {
    TileProblem p(s);
    // libxsmm: Cᵀ[n, m] = op(B)ᵀ[n, k] · Aᵀ[k, m], column-major; op(B)ᵀ is B's storage read
    // column-major, transposed when trans_b (null where libxsmm generates no such kernel). bf16 is
    // tried untransposed only: its first operand's VNNI pairs are packed for that layout.
    const libxsmm_blasint M = s.n, N = s.m, K = s.k, lda = s.trans_b ? s.k : s.n, ldb = s.k, ldc = s.n;
    const float alpha = 1.0f, beta = 0.0f;
    const int fp32_flags = s.trans_b ? LIBXSMM_GEMM_FLAG_TRANS_A : 0, vnni = LIBXSMM_GEMM_FLAG_VNNI_A;
    const int no_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;  // the three-argument kernels, whatever the environment
    const libxsmm_smmfunction xsmm_fp32 =
        libxsmm_smmdispatch(M, N, K, &lda, &ldb, &ldc, &alpha, &beta, &fp32_flags, &no_prefetch);
    const libxsmm_bsmmfunction xsmm_bf16 =
        p.b_vnni.empty() ? nullptr
                         : libxsmm_bsmmdispatch(M, N, K, &lda, &ldb, &ldc, &alpha, &beta, &vnni, &no_prefetch);

    const PathResult onednn_fp32 = measure(p, o, false, [&] {
      gemm<float>(false, s.trans_b, s.m, s.n, s.k, 1.0f, p.a.data(), s.k, p.b.data(), p.ldb(), 0.0f, p.c.data(), s.n);
    });
    std::optional<PathResult> libxsmm_fp32, libxsmm_bf16;
    if (xsmm_fp32) libxsmm_fp32 = measure(p, o, false, [&] { xsmm_fp32(p.b.data(), p.a.data(), p.c.data()); });
    const PathResult onednn_bf16 = measure(p, o, true, [&] {
      gemm_bf16(false, s.trans_b, s.m, s.n, s.k, 1.0f, p.a16.data(), s.k, p.b16.data(), p.ldb(), 0.0f, p.c.data(),
                s.n);
    });
    if (xsmm_bf16) {
      libxsmm_bf16 = measure(p, o, true, [&] {
        xsmm_bf16(reinterpret_cast<const libxsmm_bfloat16*>(p.b_vnni.data()),
                  reinterpret_cast<const libxsmm_bfloat16*>(p.a16.data()), p.c.data());
      });
    }
    const auto ratio = [](const std::optional<PathResult>& x, const PathResult& base) -> nlohmann::json {
      return x ? nlohmann::json(x->gflops / base.gflops) : nlohmann::json(nullptr);
    };
    if (libxsmm_fp32 && libxsmm_fp32->gflops > onednn_fp32.gflops) fp32_wins.push_back(s.name);
    if (libxsmm_bf16 && libxsmm_bf16->gflops > onednn_bf16.gflops) bf16_wins.push_back(s.name);
    emit({{"bench", "tiles"}, {"shape", s.name}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"trans_b", s.trans_b},
          {"onednn_fp32", path_json(onednn_fp32)}, {"libxsmm_fp32", path_json(libxsmm_fp32)},
          {"libxsmm_over_onednn_fp32", ratio(libxsmm_fp32, onednn_fp32)},
          {"onednn_bf16", path_json(onednn_bf16)}, {"libxsmm_bf16", path_json(libxsmm_bf16)},
          {"libxsmm_over_onednn_bf16", ratio(libxsmm_bf16, onednn_bf16)}});
  }
  const nlohmann::json summary = {{"bench", "tiles"},
                                  {"gemm_backend", gemm_backend_name(gemm_backend())},
                                  {"libxsmm_target", libxsmm_get_target_arch()},
                                  {"bf16_native", bf16_matmul_is_native()},
                                  {"libxsmm_faster_fp32", fp32_wins},
                                  {"libxsmm_faster_bf16", bf16_wins},
                                  {"shapes", static_cast<int>(std::size(kShapes))}};
  libxsmm_finalize();
  omp_set_num_threads(threads_before);
  return summary;
}

}  // namespace trillion
