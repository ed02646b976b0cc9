// `trillion bench moe` (see moe_bench.h).
#include "bench/moe_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/gemm.h"
#include "ops/moe_experts.h"
#include "ops/moe_router.h"
#include "ops/ref/moe_ref.h"

namespace trillion {
namespace {

// The layer's inputs and parameters, shared by both chains.
struct MoeInputs {
  Buffer<float> x, w_router, gate_up, down, dy;  // [T, H], [E, H], [E, 2I, H], [E, H, I], [T, H]
  MoeInputs(const MoeBenchOptions& o)
      : x(o.tokens * o.hidden),
        w_router(o.experts * o.hidden),
        gate_up(o.experts * 2 * o.expert_width * o.hidden),
        down(o.experts * o.hidden * o.expert_width),
        dy(o.tokens * o.hidden) {
    const CounterRng rng(o.seed, "bench_moe");
    auto fill = [&](Buffer<float>& b, uint64_t stream, double scale) {
      for (int64_t i = 0; i < b.size(); ++i) b[i] = float(scale * rng.normal((stream << 40) + i));
    };
    fill(x, 1, 1.0);
    fill(w_router, 2, 1.0 / std::sqrt(double(o.hidden)));
    fill(gate_up, 3, 1.0 / std::sqrt(double(o.hidden)));
    fill(down, 4, 1.0 / std::sqrt(double(o.expert_width)));
    fill(dy, 5, 1.0);
  }
  int64_t bytes() const { return (x.size() + w_router.size() + gate_up.size() + down.size() + dy.size()) * 4; }
};

// One forward + backward of the layer chain; the expert part is fused or fragmented. Outputs and
// gradients accumulate over runs (as parameter gradients do); zero() resets them for the check.
class MoeChain {
 public:
  MoeChain(const MoeBenchOptions& o, const MoeInputs& in, bool fused)
      : in_(in), fused_(fused), T_(o.tokens), H_(o.hidden), E_(o.experts), k_(o.top_k),
        I_(o.expert_width), logits_(T_ * E_), scores_(T_ * E_), dscores_(T_ * E_), dlogits_(T_ * E_),
        index_(T_ * k_), weight_(T_ * k_), dweight_(T_ * k_), y_(T_ * H_), dx_(T_ * H_), dw_router_(E_ * H_),
        dgate_up_(in.gate_up.size()), ddown_(in.down.size()) {
    if (fused_) {  // saved tensors of the fused experts: dropless, so rows = T · k
      gate_up_out_ = Buffer<float>(T_ * k_ * 2 * I_);
      act_ = Buffer<float>(T_ * k_ * I_);
    }
  }

  // Runs the chain and records the seconds of each phase: router, plan, experts forward, experts
  // backward, router backward.
  void run() {
    const MoeExpertDims dims{H_, I_, E_};
    const RouterDims router{E_, k_, RouterScoring::softmax, true};
    auto clock = [] { return std::chrono::steady_clock::now(); };
    auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    const auto t0 = clock();
    // logits[T, E] = x · W_routerᵀ → scores → index[T, k] → weight[T, k]
    linear_forward(logits_.data(), in_.x.data(), in_.w_router.data(), T_, H_, E_);
    router_scores_forward(scores_.data(), logits_.data(), T_, router);
    router_select<float>(index_.data(), scores_.data(), nullptr, T_, router);
    router_weights_forward(weight_.data(), scores_.data(), index_.data(), T_, router);
    const auto t1 = clock();
    moe_plan_build(plan_, index_.data(), T_, k_, E_, 0);
    const auto t2 = clock();
    if (fused_) {
      moe_experts_forward(y_.data(), gate_up_out_.data(), act_.data(), in_.x.data(), in_.gate_up.data(),
                          in_.down.data(), weight_.data(), plan_, dims);
    } else {
      moe_fragmented_forward(y_.data(), saved_, in_.x.data(), in_.gate_up.data(), in_.down.data(), weight_.data(),
                             plan_, dims);
    }
    const auto t3 = clock();
    if (fused_) {
      moe_experts_backward(dx_.data(), dweight_.data(), dgate_up_.data(), ddown_.data(), in_.dy.data(), in_.x.data(),
                           gate_up_out_.data(), act_.data(), in_.gate_up.data(),
                           in_.down.data(), weight_.data(), plan_, dims);
    } else {
      moe_fragmented_backward(dx_.data(), dweight_.data(), dgate_up_.data(), ddown_.data(), in_.dy.data(), saved_,
                              in_.gate_up.data(), in_.down.data(), plan_, dims);
      saved_ = MoeFragmentedSaved<float>();  // autograd frees what the backward consumed
    }
    const auto t4 = clock();
    // dscores = 0 + weights' backward; dlogits = scores' backward; dx += dlogits · W_router, dW_router += ...
    dscores_.zero();
    router_weights_backward(dscores_.data(), dweight_.data(), scores_.data(), index_.data(), T_, router);
    router_scores_backward(dlogits_.data(), dscores_.data(), scores_.data(), T_, router);
    linear_backward(dx_.data(), dw_router_.data(), dlogits_.data(), in_.x.data(), in_.w_router.data(), T_, H_, E_,
                    true);
    const auto t5 = clock();
    phases_.push_back({seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), seconds(t3, t4), seconds(t4, t5)});
  }

  void zero() {
    for (Buffer<float>* b : {&y_, &dx_, &dw_router_, &dgate_up_, &ddown_}) b->zero();
  }

  // Median seconds of each phase over the recorded runs.
  nlohmann::json phase_medians() const {
    static const char* const names[] = {"router_forward_s", "plan_s", "experts_forward_s", "experts_backward_s",
                                        "router_backward_s"};
    nlohmann::json out;
    for (size_t p = 0; p < 5; ++p) {
      std::vector<double> s;
      for (const auto& run : phases_) s.push_back(run[p]);
      out[names[p]] = summarize(s).median_s;
    }
    return out;
  }
  void clear_phases() { phases_.clear(); }

  // Largest relative error of this chain's outputs and gradients against another's.
  double max_rel_err(const MoeChain& ref) const {
    double err = 0;
    for (auto [a, b] : {std::pair{&y_, &ref.y_}, {&dx_, &ref.dx_}, {&dweight_, &ref.dweight_},
                        {&dw_router_, &ref.dw_router_}, {&dgate_up_, &ref.dgate_up_}, {&ddown_, &ref.ddown_}})
      err = std::max(err, relative_error(a->data(), b->data(), b->size()));
    return err;
  }
  const MoePlan& plan() const { return plan_; }

 private:
  const MoeInputs& in_;
  bool fused_;
  int64_t T_, H_, E_, k_, I_;
  Buffer<float> logits_, scores_, dscores_, dlogits_;  // [T, E] each
  Buffer<int32_t> index_;                              // [T, k]
  Buffer<float> weight_, dweight_;                     // [T, k]
  Buffer<float> y_, dx_;                               // [T, H]
  Buffer<float> dw_router_;                            // [E, H]
  Buffer<float> dgate_up_, ddown_;                     // [E, 2I, H], [E, H, I]
  Buffer<float> gate_up_out_, act_;                    // fused only: [T·k, 2I], [T·k, I]
  MoeFragmentedSaved<float> saved_;                    // fragmented only, between its forward and backward
  MoePlan plan_;
  std::vector<std::array<double, 5>> phases_;
};

// Builds a chain and runs it once (the warm-up); returns it and the peak fast-tier bytes above the
// level before it was built (its outputs, saved tensors and workspaces).
std::pair<std::unique_ptr<MoeChain>, int64_t> build_and_warm_up(const MoeBenchOptions& o, const MoeInputs& in,
                                                                bool fused) {
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  auto chain = std::make_unique<MoeChain>(o, in, fused);
  chain->run();
  chain->clear_phases();
  return {std::move(chain), MemoryStats::peak(Tier::fast) - before};
}

}  // namespace

nlohmann::json run_moe_bench(const MoeBenchOptions& o, const std::function<void(const nlohmann::json&)>& emit) {
  if (o.tokens < 1 || o.hidden < 1 || o.experts < 1 || o.expert_width < 1)
    fail("bench moe: --tokens, --hidden, --experts and --expert-width must be ≥ 1");
  if (o.top_k < 1 || o.top_k > o.experts)
    fail("bench moe: --top-k ", o.top_k, " must be in [1, --experts ", o.experts, "]");
  if (o.runs < 1 || o.baseline_runs < 1) fail("bench moe: --runs and --baseline-runs must be ≥ 1");
  if (o.gemm_size < 1) fail("bench moe: --gemm-size must be ≥ 1");
  const MoeInputs in(o);
  const double flops = 18.0 * double(o.tokens) * double(o.top_k) * double(o.hidden) * double(o.expert_width);

  auto [fused, fused_extra] = build_and_warm_up(o, in, true);
  auto [fragmented, fragmented_extra] = build_and_warm_up(o, in, false);
  // The ceiling's sgemm, the fused chain and the fragmented chain alternate, so all three see the
  // same load on a shared machine.
  SgemmProblem gemm(o.gemm_size);
  gemm.run();  // warm-up
  std::vector<double> gemm_s, fused_s, fragmented_s;
  for (int i = 0; i < std::max(o.runs, o.baseline_runs); ++i) {
    if (i < o.runs) {
      gemm_s.push_back(time_median([&] { gemm.run(); }, 0, 1).median_s);
      fused_s.push_back(time_median([&] { fused->run(); }, 0, 1).median_s);
    }
    if (i < o.baseline_runs) fragmented_s.push_back(time_median([&] { fragmented->run(); }, 0, 1).median_s);
  }
  const TimingResult gemm_time = summarize(gemm_s), fused_time = summarize(fused_s);
  const TimingResult fragmented_time = summarize(fragmented_s);
  const double ceiling_gflops = gemm.flops() / gemm_time.median_s * 1e-9;
  emit({{"bench", "moe"}, {"measurement", "sgemm_ceiling"}, {"size", gemm.size()}, {"gflops", ceiling_gflops},
        {"median_s", gemm_time.median_s}, {"min_s", gemm_time.min_s}, {"runs", gemm_time.runs}});
  const int64_t fused_peak = in.bytes() + fused_extra;
  const int64_t fragmented_peak = in.bytes() + fragmented_extra;
  for (auto [name, chain, time, peak] : {std::tuple{"fused", fused.get(), fused_time, fused_peak},
                                         {"fragmented", fragmented.get(), fragmented_time, fragmented_peak}}) {
    nlohmann::json line = {{"bench", "moe"},      {"measurement", name}, {"median_s", time.median_s},
                           {"min_s", time.min_s}, {"runs", time.runs},   {"gflops", flops / time.median_s * 1e-9},
                           {"peak_bytes", peak}};
    line.update(chain->phase_medians());
    emit(line);
  }

  // Accuracy: one more run of each from zeroed outputs.
  fused->zero();
  fragmented->zero();
  fused->run();
  fragmented->run();
  const double max_rel_err = fused->max_rel_err(*fragmented);

  const MoePlan& plan = fused->plan();
  int64_t max_load = 0;
  for (int64_t e = 0; e < o.experts; ++e) max_load = std::max(max_load, plan.offsets[e + 1] - plan.offsets[e]);
  const double mean_load = double(plan.rows()) / double(o.experts);
  nlohmann::json summary = bench_summary("moe", fused_time, fragmented_time, max_rel_err, flops, ceiling_gflops,
                                         gemm.size(), fused_peak, fragmented_peak);
  summary.update({{"tokens", o.tokens},
          {"hidden", o.hidden},
          {"experts", o.experts},
          {"top_k", o.top_k},
          {"expert_width", o.expert_width},
          {"rows", plan.rows()},
          {"dropped", plan.total_dropped()},
          {"tokens_per_expert_max", max_load},
          {"tokens_per_expert_mean", mean_load},
          {"seed", o.seed},
          {"threads", num_threads()}});
  return summary;
}

}  // namespace trillion
