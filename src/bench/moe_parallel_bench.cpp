// The expert exchange's overlap, measured (see moe_parallel_bench.h).
#include "bench/moe_parallel_bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "parallel/mesh.h"
#include "parallel/parallel_plan.h"
#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace trillion {

nlohmann::json run_moe_parallel_bench(const MoeParallelBenchOptions& o) {
  const ProcessGroup& world = ProcessGroup::world();
  const int ranks = world.size();
  if (o.ep < 2 || ranks % o.ep != 0)
    fail("bench moe-parallel: --ep ", o.ep, " must be ≥ 2 and divide the ", ranks, " ranks (run it under mpirun)");
  if (o.seq_len < 1) fail("bench moe-parallel: --seq-len must be ≥ 1, got ", o.seq_len);
  if (o.steps < 1 || o.rounds < 1 || o.warmup < 0 || o.chunks < 2)
    fail("bench moe-parallel: --steps and --rounds must be ≥ 1, --warmup ≥ 0, --chunks ≥ 2");
  const ModelConfig config = ModelConfig::load(o.config);
  const ParallelMesh mesh(world, o.ep, config);
  const int64_t rows = mesh.rows_per_rank(o.batch, "bench moe-parallel: --batch");

  Model<float> model(config);
  model.init_weights(o.seed);
  model.zero_grads();
  const ShardLayout layout(model.table(), world.rank(), ranks, o.ep);
  ParallelPlan<float> plan(model, mesh, layout);
  ExpertParallel& experts = *plan.experts();  // ep ≥ 2

  // Random token rows of the global batch; this rank trains its rows.
  const int64_t n = rows * o.seq_len, V = config.vocab_size;
  const CounterRng rng(o.seed, "bench moe-parallel tokens");
  std::vector<int32_t> tokens(n), targets(n);  // [rows, seq] each
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t at = static_cast<uint64_t>(world.rank() * n + i);
    tokens[i] = static_cast<int32_t>(rng.bits(2 * at) % uint64_t(V));
    targets[i] = static_cast<int32_t>(rng.bits(2 * at + 1) % uint64_t(V));
  }
  const LossScales scales{1.0 / static_cast<double>(o.batch * o.seq_len), 1.0};
  const auto step = [&] {  // the global mean loss; gradients are reduce-scattered and dropped
    const StepResult result = model.forward_backward(tokens.data(), targets.data(), rows, o.seq_len, scales);
    return world.all_reduce_sum(result.lm.loss_sum) * scales.lm;
  };

  struct Mode {
    int chunks;
    double step_s = 0.0, wait_s = 0.0, loss = 0.0;
    int timed = 0;
  };
  Mode modes[2] = {{1}, {o.chunks}};
  for (int round = 0; round < o.rounds; ++round) {
    for (Mode& mode : modes) {
      experts.set_chunks(mode.chunks);
      for (int i = 0; i < o.warmup; ++i) mode.loss = step();
      for (int i = 0; i < o.steps; ++i) {
        const double wait_before = experts.counters().wait_s;
        const auto start = std::chrono::steady_clock::now();
        const double loss = step();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        mode.loss = loss;
        // The slowest rank's step; the ranks' mean wait.
        const std::vector<double> per_rank =
            world.all_gather_values<double>({seconds, experts.counters().wait_s - wait_before});  // [ranks, 2]
        double slowest = 0.0;
        for (int r = 0; r < ranks; ++r) {
          slowest = std::max(slowest, per_rank[2 * r]);
          mode.wait_s += per_rank[2 * r + 1] / ranks;
        }
        mode.step_s += slowest;
        ++mode.timed;
      }
    }
  }
  const auto summary_of = [](const Mode& m) {
    return nlohmann::json{{"chunks", m.chunks}, {"step_s", m.step_s / m.timed}, {"wait_s", m.wait_s / m.timed},
                          {"loss", m.loss}};
  };
  const double serial_wait = modes[0].wait_s / modes[0].timed, pipelined_wait = modes[1].wait_s / modes[1].timed;
  return {{"bench", "moe-parallel"},
          {"config", o.config},
          {"ranks", ranks},
          {"ep", o.ep},
          {"batch", o.batch},
          {"seq_len", o.seq_len},
          {"steps", o.steps},
          {"rounds", o.rounds},
          {"serial", summary_of(modes[0])},
          {"pipelined", summary_of(modes[1])},
          {"speedup", modes[0].step_s / modes[1].step_s * modes[1].timed / modes[0].timed},
          {"hidden_fraction", serial_wait > 0.0 ? 1.0 - pipelined_wait / serial_wait : 0.0}};
}

}  // namespace trillion
