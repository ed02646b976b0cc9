// `trillion bench step` (see the header).
#include "bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "bench/physical_peak.h"
#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "ops/vector_exp.h"
#include "train/optimizer.h"

namespace trillion {

nlohmann::json run_step_bench(const StepBenchOptions& o) {
  if (o.batch < 1 || o.seq_len < 1) fail("bench step: --batch and --seq-len must be ≥ 1");
  if (o.steps < 1 || o.warmup < 0) fail("bench step: --steps must be ≥ 1 and --warmup ≥ 0");
  if (o.gemm_size < 1) fail("bench step: --gemm-size must be ≥ 1");
  const MatmulPrecisionScope precision(matmul_precision_from_name(o.precision, "bench step: --precision"));
  const ModelConfig config = ModelConfig::load(o.config);
  const int64_t n = o.batch * o.seq_len, V = config.vocab_size;
  Model<float> model(config);
  model.init_weights(o.seed);
  model.zero_grads();
  Optimizer<float> optimizer(model.table());
  const AdamWHyper hyper;
  // Random token rows; each target is the next token of its row (the last one predicts a fresh one).
  const CounterRng rng(o.seed, "bench step tokens");
  std::vector<int32_t> tokens(n), targets(n);  // [batch, seq] each
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(rng.bits(i) % static_cast<uint64_t>(V));
  for (int64_t i = 0; i < n; ++i)
    targets[i] = (i + 1) % o.seq_len != 0 ? tokens[i + 1] : static_cast<int32_t>(rng.bits(n + i) % uint64_t(V));
  const LossScales scales{1.0 / static_cast<double>(n), 1.0};

  int64_t step = 0;
  std::vector<double> losses;
  const auto train_step = [&] {
    const StepResult result = model.forward_backward(tokens.data(), targets.data(), o.batch, o.seq_len, scales);
    optimizer.clip_and_step(model.params(), model.grads(), ++step, hyper, /*max_norm=*/1.0);
    model.zero_grads();
    losses.push_back(result.lm.loss_sum / static_cast<double>(n));
  };
  for (int i = 0; i < o.warmup; ++i) train_step();

  SgemmProblem gemm(o.gemm_size);
  gemm.run();  // warm-up
  std::vector<double> step_seconds, gemm_seconds;
  PhaseTimes total;  // summed over the timed steps
  double worst_coverage_error = 0.0;
  MemoryStats::reset_peak(Tier::fast);
  for (int i = 0; i < o.steps; ++i) {
    PhaseClock::start();
    const auto start = std::chrono::steady_clock::now();
    train_step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const PhaseTimes times = PhaseClock::stop();
    step_seconds.push_back(seconds);
    double accounted = times.idle;
    for (int p = 0; p < kNumPhases; ++p) {
      total.seconds[p] += times.seconds[p];
      accounted += times.seconds[p];
    }
    total.idle += times.idle;
    total.threads = times.threads;
    worst_coverage_error = std::max(worst_coverage_error, std::abs(accounted / times.threads / seconds - 1.0));
    const auto gemm_start = std::chrono::steady_clock::now();
    gemm.run();
    gemm_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - gemm_start).count());
  }
  const TimingResult timing = summarize(step_seconds);
  const double gemm_rate = gemm.flops() / std::max(summarize(gemm_seconds).median_s, 1e-9);
  const double flops_per_token = model.training_flops_per_token(o.seq_len);
  const MatmulPrecision precision_in_use = matmul_precision();
  const PhysicalPeak peak = measure_physical_peak();
  const double tokens_per_s = static_cast<double>(n) / timing.median_s;

  // Per step, in seconds of the whole team (thread-seconds / threads).
  const double per_step = 1.0 / (static_cast<double>(o.steps) * total.threads);
  nlohmann::json phases = nlohmann::json::object();
  double phase_sum = total.idle * per_step;
  for (int p = 0; p < kNumPhases; ++p) {
    phases[phase_name(static_cast<Phase>(p))] = total.seconds[p] * per_step;
    phase_sum += total.seconds[p] * per_step;
  }
  double mean_step = 0.0;
  for (double s : step_seconds) mean_step += s / static_cast<double>(o.steps);
  return {{"bench", "step"},
          {"config", o.config},
          {"model_type", config.model_type},
          {"batch", o.batch},
          {"seq_len", o.seq_len},
          {"threads", num_threads()},
          {"vector_isa", vector_isa_name(vector_isa())},
          {"precision", o.precision},
          {"steps", o.steps},
          {"warmup", o.warmup},
          {"step_s", timing.median_s},
          {"min_step_s", timing.min_s},
          {"mean_step_s", mean_step},
          {"tokens_per_s", tokens_per_s},
          {"flops_per_token", flops_per_token},
          {"sgemm_gflops", gemm_rate * 1e-9},
          {"ceiling_gemm_size", o.gemm_size},
          {"mfu", flops_per_token * tokens_per_s / gemm_rate},
          {"peak_gflops", peak.flops(precision_in_use) * 1e-9},
          {"peak_formula", peak.formula(precision_in_use)},
          {"mfu_peak", flops_per_token * tokens_per_s / peak.flops(precision_in_use)},
          {"phases_s", phases},
          {"idle_s", total.idle * per_step},
          {"phase_sum_s", phase_sum},
          {"coverage", phase_sum / mean_step},
          {"worst_step_coverage_error", worst_coverage_error},
          {"first_loss", losses.front()},
          {"last_loss", losses.back()},
          {"peak_fast_bytes", MemoryStats::peak(Tier::fast)}};
}

}  // namespace trillion
