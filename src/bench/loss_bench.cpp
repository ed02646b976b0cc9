// `trillion bench loss` (see loss_bench.h).
#include "bench/loss_bench.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"
#include "ops/ref/cross_entropy_ref.h"

namespace trillion {
namespace {

// The gradients and loss of one path (outputs, shared by all paths in kind and size).
struct LossOutputs {
  Buffer<float> dh, dw;  // [tokens, hidden], [vocab, hidden]
  double loss_sum = 0.0;
  LossOutputs(int64_t tokens, int64_t hidden, int64_t vocab) : dh(tokens * hidden), dw(vocab * hidden) { dw.zero(); }
};

// Times the paths in rotation (one run of each per round; a path drops out once it has its runs), so
// that all of them see the same machine load. The caller has run each once already (warm-up).
std::vector<TimingResult> time_in_rotation(const std::vector<std::function<void()>>& paths,
                                           const std::vector<int>& runs) {
  std::vector<std::vector<double>> seconds(paths.size());
  const int rounds = *std::max_element(runs.begin(), runs.end());
  for (int round = 0; round < rounds; ++round)
    for (size_t p = 0; p < paths.size(); ++p)
      if (round < runs[p]) seconds[p].push_back(time_median(paths[p], 0, 1).median_s);
  std::vector<TimingResult> results;
  for (const std::vector<double>& path_seconds : seconds)
    results.push_back(path_seconds.empty() ? TimingResult{} : summarize(path_seconds));  // a path of no runs
  return results;
}

double max_rel_err(const LossOutputs& actual, const LossOutputs& expected) {
  return std::max({std::abs(actual.loss_sum - expected.loss_sum) / std::max(std::abs(expected.loss_sum), 1e-30),
                   relative_error(actual.dh.data(), expected.dh.data(), expected.dh.size()),
                   relative_error(actual.dw.data(), expected.dw.data(), expected.dw.size())});
}

}  // namespace

nlohmann::json run_loss_bench(const LossBenchOptions& o, const std::function<void(const nlohmann::json&)>& emit) {
  if (o.tokens < 1 || o.hidden < 1 || o.vocab < 2) fail("bench loss: --tokens and --hidden must be ≥ 1, --vocab ≥ 2");
  if (!(o.z_loss >= 0.0)) fail("bench loss: --z-loss must be ≥ 0, got ", o.z_loss);
  if (o.runs < 1 || o.baseline_runs < 1) fail("bench loss: --runs and --baseline-runs must be ≥ 1");
  if (o.gemm_size < 1) fail("bench loss: --gemm-size must be ≥ 1");
  const MatmulPrecisionScope precision(matmul_precision_from_name(o.precision, "bench loss: --precision"));
  const bool bf16 = matmul_precision() == MatmulPrecision::bf16;
  const int64_t T = o.tokens, H = o.hidden, V = o.vocab;
  Buffer<float> h(T * H), w(V * H);  // [tokens, hidden] hidden states, [vocab, hidden] head weight
  std::vector<int32_t> targets(T);   // [tokens]; every tenth row ignored
  const CounterRng rng(11, "bench_loss");
  for (int64_t i = 0; i < T * H; ++i) h[i] = float(rng.normal(i));
  const float w_std = float(1.0 / std::sqrt(double(H)));
  for (int64_t i = 0; i < V * H; ++i) w[i] = w_std * float(rng.normal(T * H + i));
  int64_t counted = 0;
  for (int64_t r = 0; r < T; ++r) {
    targets[r] = r % 10 == 9 ? kIgnoreIndex : int32_t(rng.bits(r) % uint64_t(V));
    counted += targets[r] != kIgnoreIndex;
  }
  const double scale = 1.0 / double(std::max<int64_t>(counted, 1));

  LossOutputs fused(T, H, V), recompute(T, H, V), plain(T, H, V);
  LossOutputs rounding(bf16 ? T : 0, H, bf16 ? V : 0);  // the fused path without its dlogits copy: bf16 only
  Buffer<float> saved_lse(T);  // [tokens] the recompute pair's saved tensor
  const auto fused_path = [&](LossOutputs& out, bool dlogits_copy) {
    CrossEntropyTiling tiling;
    tiling.bf16_dlogits = dlogits_copy;
    out.loss_sum = lm_head_cross_entropy_forward_backward<float>(out.dh.data(), out.dw.data(), nullptr, h.data(),
                                                                 w.data(), targets.data(), scale, o.z_loss, T, H, V,
                                                                 tiling)
                       .loss_sum;
  };
  auto run_fused = [&] { fused_path(fused, true); };
  auto run_rounding = [&] { fused_path(rounding, false); };
  auto run_recompute = [&] {
    recompute.loss_sum = lm_head_cross_entropy_forward<float>(saved_lse.data(), h.data(), w.data(), targets.data(),
                                                              T, H, V)
                             .loss_sum;
    lm_head_cross_entropy_backward<float>(recompute.dh.data(), recompute.dw.data(), h.data(), w.data(),
                                          targets.data(), saved_lse.data(), scale, T, H, V);
  };
  auto run_plain = [&] {
    plain.loss_sum = lm_head_cross_entropy_plain<float>(plain.dh.data(), plain.dw.data(), nullptr, h.data(),
                                                        w.data(), targets.data(), scale, o.z_loss, T, H, V)
                         .loss_sum;
  };
  // The first run of each path is its warm-up; it also measures peak bytes and (dw starting at zero)
  // the accuracy. Later runs keep accumulating into dw, which the times do not depend on.
  const int64_t fused_peak = peak_extra_bytes(run_fused);
  const int64_t rounding_peak = bf16 ? peak_extra_bytes(run_rounding) : 0;
  const auto equal = [](const Buffer<float>& a, const Buffer<float>& b) {
    return std::equal(a.data(), a.data() + a.size(), b.data());
  };
  const bool same_bits =
      !bf16 || (rounding.loss_sum == fused.loss_sum && equal(rounding.dh, fused.dh) && equal(rounding.dw, fused.dw));
  const int64_t recompute_peak = peak_extra_bytes(run_recompute) + saved_lse.size() * int64_t(sizeof(float));
  const int64_t plain_peak = peak_extra_bytes(run_plain);
  const double fused_err = max_rel_err(fused, plain);
  const double recompute_err = max_rel_err(recompute, plain);
  SgemmProblem gemm(o.gemm_size);
  gemm.run();
  const std::vector<TimingResult> times =
      time_in_rotation({[&] { gemm.run(); }, run_fused, run_recompute, run_plain, run_rounding},
                       {o.runs, o.runs, o.baseline_runs, o.baseline_runs, bf16 ? o.runs : 0});
  const TimingResult &gemm_time = times[0], &fused_time = times[1], &recompute_time = times[2],
                     &plain_time = times[3], &rounding_time = times[4];

  const double ceiling_gflops = gemm.flops() / gemm_time.median_s * 1e-9;
  emit({{"bench", "loss"}, {"measurement", "sgemm_ceiling"}, {"size", gemm.size()}, {"gflops", ceiling_gflops},
        {"median_s", gemm_time.median_s}, {"min_s", gemm_time.min_s}, {"runs", gemm_time.runs}});
  const double flops = 3.0 * 2.0 * double(T) * double(H) * double(V);
  for (auto [name, time, peak] : {std::tuple{"fused", &fused_time, fused_peak},
                                  {"fused_rounding", &rounding_time, rounding_peak},
                                  {"recompute", &recompute_time, recompute_peak}, {"plain", &plain_time, plain_peak}}) {
    if (time->runs == 0) continue;  // fused_rounding outside bf16
    emit({{"bench", "loss"}, {"measurement", name}, {"median_s", time->median_s}, {"min_s", time->min_s},
          {"runs", time->runs}, {"gflops", flops / time->median_s * 1e-9}, {"peak_bytes", peak}});
  }

  nlohmann::json summary = bench_summary("loss", fused_time, plain_time, fused_err, flops, ceiling_gflops,
                                         gemm.size(), fused_peak, plain_peak);
  summary.update({{"ratio_recompute", recompute_time.median_s / fused_time.median_s},
                  {"recompute_s", recompute_time.median_s},
                  {"recompute_peak_bytes", recompute_peak},
                  {"plain_s", plain_time.median_s},
                  {"fused_row_chunk", forward_backward_row_chunk(T, V, int64_t(sizeof(float)))},
                  {"tokens", T},
                  {"hidden", H},
                  {"vocab", V},
                  {"z_loss", o.z_loss},
                  {"precision", o.precision},
                  {"threads", num_threads()}});
  if (o.z_loss == 0.0) summary["recompute_rel_err"] = recompute_err;
  if (bf16) summary.update({{"dlogits_copy_speedup", rounding_time.median_s / fused_time.median_s},
                            {"dlogits_copy_same_bits", same_bits}});
  return summary;
}

}  // namespace trillion
