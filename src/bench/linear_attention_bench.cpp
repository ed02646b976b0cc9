// `trillion bench linear-attention` (see linear_attention_bench.h).
#include "bench/linear_attention_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/ref/delta_rule_chunk_ref.h"

namespace trillion {
namespace {

const char* decay_name(DeltaDecay decay) { return decay == DeltaDecay::per_head ? "per_head" : "per_key_channel"; }

// The kernels' inputs, shared by both forms and both decay kinds (g of each kind).
struct LinearAttentionInputs {
  Buffer<float> q, k, v, d_o, beta;  // [T, H, K] × 2, [T, H, V] × 2, [T, H]
  Buffer<float> g_head, g_channel;   // [T, H], [T, H, K]
  LinearAttentionInputs(const LinearAttentionBenchOptions& o)
      : q(o.tokens * o.heads * o.key_dim),
        k(o.tokens * o.heads * o.key_dim),
        v(o.tokens * o.heads * o.value_dim),
        d_o(o.tokens * o.heads * o.value_dim),
        beta(o.tokens * o.heads),
        g_head(o.tokens * o.heads),
        g_channel(o.tokens * o.heads * o.key_dim) {
    const CounterRng rng(o.seed, "bench_linear_attention");
    auto normal = [&](Buffer<float>& b, uint64_t stream) {
      for (int64_t i = 0; i < b.size(); ++i) b[i] = float(rng.normal((stream << 40) + i));
    };
    auto uniform = [&](Buffer<float>& b, uint64_t stream, double lo, double hi) {
      for (int64_t i = 0; i < b.size(); ++i) b[i] = float(lo + (hi - lo) * rng.uniform((stream << 40) + i));
    };
    normal(q, 1);
    normal(k, 2);
    normal(v, 3);
    normal(d_o, 4);
    uniform(beta, 5, 0.1, 0.9);  // uniform() is in (0, 1): β in (0.1, 0.9)
    uniform(g_head, 6, -0.5, -0.01);
    uniform(g_channel, 7, -0.5, -0.01);
    // Rows of q and k L2-normalized, q scaled by K^−½, as the caller of the kernels does.
    const int64_t K = o.key_dim;
    for (int64_t row = 0; row < o.tokens * o.heads; ++row) {
      for (auto [x, scale] : {std::pair{q.data() + row * K, 1.0 / std::sqrt(double(K))}, {k.data() + row * K, 1.0}}) {
        double norm2 = 0;
        for (int64_t i = 0; i < K; ++i) norm2 += double(x[i]) * double(x[i]);
        const double f = scale / std::sqrt(std::max(norm2, 1e-30));
        for (int64_t i = 0; i < K; ++i) x[i] = float(x[i] * f);
      }
    }
  }
  const float* g(DeltaDecay decay) const { return decay == DeltaDecay::per_head ? g_head.data() : g_channel.data(); }
  // Bytes of the inputs one run reads (g of the given kind only).
  int64_t bytes(DeltaDecay decay) const {
    const int64_t g_count = decay == DeltaDecay::per_head ? g_head.size() : g_channel.size();
    return (q.size() + k.size() + v.size() + d_o.size() + beta.size() + g_count) * int64_t(sizeof(float));
  }
};

// The three forms timed: the fused chunked kernel, the recurrent one (the baseline) and the plain
// unfused chunked composition (ops/ref/delta_rule_chunk_ref.h; both decay kinds).
enum class DeltaRuleForm { chunked, recurrent, unfused };

// One form's forward + backward, its outputs (all written, =) and the seconds of each phase.
class DeltaRuleRun {
 public:
  DeltaRuleRun(const LinearAttentionInputs& in, const DeltaRuleSizes& s, DeltaRuleForm form)
      : in_(in), s_(s), form_(form),
        o_(s.seq_len * s.heads * s.value_dim), dq_(s.seq_len * s.heads * s.key_dim),
        dk_(s.seq_len * s.heads * s.key_dim), dv_(s.seq_len * s.heads * s.value_dim),
        dg_(s.decay == DeltaDecay::per_head ? s.seq_len * s.heads : s.seq_len * s.heads * s.key_dim),
        dbeta_(s.seq_len * s.heads) {}

  void run() {
    const float* g = in_.g(s_.decay);
    const auto t0 = std::chrono::steady_clock::now();
    if (form_ == DeltaRuleForm::chunked) {
      delta_rule_chunk_forward(o_.data(), static_cast<float*>(nullptr), in_.q.data(), in_.k.data(), in_.v.data(), g,
                               in_.beta.data(), static_cast<const float*>(nullptr), nullptr, s_);
    } else if (form_ == DeltaRuleForm::unfused) {
      delta_rule_chunk_ref_forward(o_.data(), static_cast<float*>(nullptr), in_.q.data(), in_.k.data(), in_.v.data(),
                                   g, in_.beta.data(), static_cast<const float*>(nullptr), nullptr, s_);
    } else {
      delta_rule_recurrent_forward(o_.data(), static_cast<float*>(nullptr), in_.q.data(), in_.k.data(), in_.v.data(),
                                   g, in_.beta.data(), static_cast<const float*>(nullptr), nullptr, s_);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (form_ == DeltaRuleForm::chunked) {
      delta_rule_chunk_backward(dq_.data(), dk_.data(), dv_.data(), dg_.data(), dbeta_.data(),
                                static_cast<float*>(nullptr), in_.d_o.data(), static_cast<const float*>(nullptr),
                                in_.q.data(), in_.k.data(), in_.v.data(), g, in_.beta.data(),
                                static_cast<const float*>(nullptr), nullptr, s_);
    } else if (form_ == DeltaRuleForm::unfused) {
      delta_rule_chunk_ref_backward(dq_.data(), dk_.data(), dv_.data(), dg_.data(), dbeta_.data(),
                                    static_cast<float*>(nullptr), in_.d_o.data(), static_cast<const float*>(nullptr),
                                    in_.q.data(), in_.k.data(), in_.v.data(), g, in_.beta.data(),
                                    static_cast<const float*>(nullptr), nullptr, s_);
    } else {
      delta_rule_recurrent_backward(dq_.data(), dk_.data(), dv_.data(), dg_.data(), dbeta_.data(),
                                    static_cast<float*>(nullptr), in_.d_o.data(), static_cast<const float*>(nullptr),
                                    in_.q.data(), in_.k.data(), in_.v.data(), g, in_.beta.data(),
                                    static_cast<const float*>(nullptr), nullptr, s_);
    }
    const auto t2 = std::chrono::steady_clock::now();
    forward_s_.push_back(std::chrono::duration<double>(t1 - t0).count());
    backward_s_.push_back(std::chrono::duration<double>(t2 - t1).count());
  }

  int64_t output_bytes() const {
    return (o_.size() + dq_.size() + dk_.size() + dv_.size() + dg_.size() + dbeta_.size()) * int64_t(sizeof(float));
  }
  // Median seconds of the forward and of the backward over the recorded runs.
  nlohmann::json phase_medians() const {
    return {{"forward_s", summarize(forward_s_).median_s}, {"backward_s", summarize(backward_s_).median_s}};
  }
  void clear_phases() {
    forward_s_.clear();
    backward_s_.clear();
  }
  // Largest relative error of this run's output and gradients against another's.
  double max_rel_err(const DeltaRuleRun& ref) const {
    double err = 0;
    for (auto [a, b] : {std::pair{&o_, &ref.o_}, {&dq_, &ref.dq_}, {&dk_, &ref.dk_}, {&dv_, &ref.dv_},
                        {&dg_, &ref.dg_}, {&dbeta_, &ref.dbeta_}})
      err = std::max(err, relative_error(a->data(), b->data(), b->size()));
    return err;
  }

 private:
  const LinearAttentionInputs& in_;
  DeltaRuleSizes s_;
  DeltaRuleForm form_;
  Buffer<float> o_, dq_, dk_, dv_, dg_, dbeta_;  // [T, H, V], [T, H, K] × 2, [T, H, V], g's shape, [T, H]
  std::vector<double> forward_s_, backward_s_;
};

// One decay kind: emits its measurement lines and returns its summary.
// The sizes every summary line carries.
nlohmann::json size_fields(const LinearAttentionBenchOptions& o) {
  return {{"tokens", o.tokens},   {"heads", o.heads},           {"key_dim", o.key_dim},  {"value_dim", o.value_dim},
          {"chunk", kDeltaRuleChunk}, {"seed", o.seed}, {"threads", num_threads()}};
}

nlohmann::json run_decay_kind(const LinearAttentionBenchOptions& o, const LinearAttentionInputs& in,
                              SgemmProblem& gemm, DeltaDecay decay,
                              const std::function<void(const nlohmann::json&)>& emit) {
  const DeltaRuleSizes s{1, o.tokens, o.heads, o.key_dim, o.value_dim, 0, decay};
  const char* name = decay_name(decay);
  const double flops = linear_attention_bench_flops(o.tokens, o.heads, o.key_dim, o.value_dim);

  // Outputs are allocated before the peak is taken: the peak above them is the workspace.
  // Also the plain unfused chunked composition (both decay kinds).
  DeltaRuleRun chunked(in, s, DeltaRuleForm::chunked), recurrent(in, s, DeltaRuleForm::recurrent);
  DeltaRuleRun unfused(in, s, DeltaRuleForm::unfused);
  const int64_t chunked_workspace = peak_extra_bytes([&] { chunked.run(); });  // also the warm-up
  const int64_t recurrent_workspace = peak_extra_bytes([&] { recurrent.run(); });
  const int64_t unfused_workspace = peak_extra_bytes([&] { unfused.run(); });
  chunked.clear_phases();
  recurrent.clear_phases();
  unfused.clear_phases();
  // The ceiling's sgemm, the chunked, the recurrent and the unfused kernel alternate, so
  // all see the same load on a shared machine.
  gemm.run();  // warm-up
  std::vector<double> gemm_s, chunked_s, recurrent_s, unfused_s;
  for (int i = 0; i < std::max(o.runs, o.baseline_runs); ++i) {
    if (i < o.runs) {
      gemm_s.push_back(time_median([&] { gemm.run(); }, 0, 1).median_s);
      chunked_s.push_back(time_median([&] { chunked.run(); }, 0, 1).median_s);
    }
    if (i < o.baseline_runs) {
      recurrent_s.push_back(time_median([&] { recurrent.run(); }, 0, 1).median_s);
      unfused_s.push_back(time_median([&] { unfused.run(); }, 0, 1).median_s);
    }
  }
  const TimingResult gemm_time = summarize(gemm_s), chunked_time = summarize(chunked_s);
  const TimingResult recurrent_time = summarize(recurrent_s);
  const double ceiling_gflops = gemm.flops() / gemm_time.median_s * 1e-9;
  emit({{"bench", "linear-attention"}, {"decay", name}, {"measurement", "sgemm_ceiling"}, {"size", gemm.size()},
        {"gflops", ceiling_gflops}, {"median_s", gemm_time.median_s}, {"min_s", gemm_time.min_s},
        {"runs", gemm_time.runs}});
  const int64_t chunked_peak = in.bytes(decay) + chunked.output_bytes() + chunked_workspace;
  const int64_t recurrent_peak = in.bytes(decay) + recurrent.output_bytes() + recurrent_workspace;
  for (auto [what, run, time, peak, workspace] :
       {std::tuple{"chunked", &chunked, chunked_time, chunked_peak, chunked_workspace},
        {"recurrent", &recurrent, recurrent_time, recurrent_peak, recurrent_workspace}}) {
    nlohmann::json line = {{"bench", "linear-attention"}, {"decay", name},          {"measurement", what},
                           {"median_s", time.median_s},    {"min_s", time.min_s},    {"runs", time.runs},
                           {"gflops", flops / time.median_s * 1e-9}, {"peak_bytes", peak},
                           {"workspace_bytes", workspace}};
    line.update(run->phase_medians());
    emit(line);
  }

  // All forms write (=) every output, so the last timed runs are the ones compared; the unfused
  // form is compared with the fused chunked kernel, and its error folded into max_rel_err.
  const double unfused_rel_err = unfused.max_rel_err(chunked);
  const double max_rel_err = std::max(chunked.max_rel_err(recurrent), unfused_rel_err);
  nlohmann::json summary = bench_summary("linear-attention", chunked_time, recurrent_time, max_rel_err, flops,
                                         ceiling_gflops, gemm.size(), chunked_peak, recurrent_peak);
  summary["decay"] = name;
  summary.update(size_fields(o));
  const TimingResult unfused_time = summarize(unfused_s);
  const nlohmann::json phases = unfused.phase_medians();
  summary.update({{"unfused_s", unfused_time.median_s},
                  {"ratio_unfused", unfused_time.median_s / chunked_time.median_s},
                  {"unfused_forward_s", phases.at("forward_s")},
                  {"unfused_backward_s", phases.at("backward_s")},
                  {"unfused_max_rel_err", unfused_rel_err},
                  {"unfused_peak_bytes", in.bytes(decay) + unfused.output_bytes() + unfused_workspace}});
  return summary;
}

}  // namespace

double linear_attention_bench_flops(int64_t tokens, int64_t heads, int64_t key_dim, int64_t value_dim) {
  const double C = double(kDeltaRuleChunk), K = double(key_dim), V = double(value_dim);
  return 3.0 * double(tokens) * double(heads) * (2.0 * C * (3.0 * K + 2.0 * V) + 6.0 * K * V);
}

nlohmann::json run_linear_attention_bench(const LinearAttentionBenchOptions& o,
                                          const std::function<void(const nlohmann::json&)>& emit) {
  if (o.tokens < 1 || o.heads < 1 || o.key_dim < 1 || o.value_dim < 1)
    fail("bench linear-attention: --tokens, --heads, --key-dim and --value-dim must be ≥ 1");
  if (o.runs < 1 || o.baseline_runs < 1) fail("bench linear-attention: --runs and --baseline-runs must be ≥ 1");
  if (o.gemm_size < 1) fail("bench linear-attention: --gemm-size must be ≥ 1");
  std::vector<DeltaDecay> kinds;
  if (o.decay == "per_head" || o.decay == "both") kinds.push_back(DeltaDecay::per_head);
  if (o.decay == "per_key_channel" || o.decay == "both") kinds.push_back(DeltaDecay::per_key_channel);
  if (kinds.empty())
    fail("bench linear-attention: --decay must be per_head, per_key_channel or both, got '", o.decay, "'");

  const LinearAttentionInputs in(o);
  SgemmProblem gemm(o.gemm_size);
  std::vector<nlohmann::json> summaries;
  for (DeltaDecay decay : kinds) summaries.push_back(run_decay_kind(o, in, gemm, decay, emit));
  if (summaries.size() == 1) return summaries.front();

  // Combined: the per-head speedup (Gated DeltaNet, the baseline shape), the worst error,
  // ceiling fraction and memory ratio over the kinds, and each kind's summary under its name.
  for (const nlohmann::json& summary : summaries) emit(summary);
  nlohmann::json combined = {{"bench", "linear-attention"},
                             {"decay", "both"},
                             {"speedup", summaries.front().at("speedup")},
                             {"speedup_decay", summaries.front().at("decay")}};
  // unfused_s / ratio_unfused of per_head (as speedup), and per_key_channel's ratio by name.
  for (const char* field : {"unfused_s", "ratio_unfused"}) combined[field] = summaries.front().at(field);
  combined["ratio_unfused_per_key_channel"] = summaries.back().at("ratio_unfused");
  double max_rel_err = 0, ceiling_fraction = INFINITY, memory_ratio = INFINITY;
  for (const nlohmann::json& summary : summaries) {
    max_rel_err = std::max(max_rel_err, summary.at("max_rel_err").get<double>());
    const double fraction = summary.at("ceiling_fraction").get<double>();
    if (fraction < ceiling_fraction) {
      ceiling_fraction = fraction;
      combined["ceiling_fraction_decay"] = summary.at("decay");
      combined["ceiling_gflops"] = summary.at("ceiling_gflops");  // the ceiling of that fraction
      combined["fused_gflops"] = summary.at("fused_gflops");
    }
    memory_ratio = std::min(memory_ratio, summary.at("memory_ratio").get<double>());
    nlohmann::json kind = summary;
    kind.erase("bench");
    combined[summary.at("decay").get<std::string>()] = kind;
  }
  combined.update({{"max_rel_err", max_rel_err},
                   {"ceiling_fraction", ceiling_fraction},
                   {"ceiling_gemm_size", gemm.size()},
                   {"memory_ratio", memory_ratio},
                   {"flops", summaries.front().at("flops")}});
  combined.update(size_fields(o));
  return combined;
}

}  // namespace trillion
