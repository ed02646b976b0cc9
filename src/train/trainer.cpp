// The training loop of `trillion train` (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "core/machine_memory.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "data/mixture.h"
#include "data/tokenizer.h"
#include "data/shards.h"
#include "io/atomic_file.h"
#include "memory/save_policies.h"
#include "model/config.h"
#include "model/lightning_indexer.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/process_group.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/moe_balance.h"
#include "train/numeric_guard.h"
#include "train/optimizer.h"
#include "train/run_setup.h"
#include "train/stop_signals.h"
#include "train/sharded_checkpoint.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the activation store did in one step (metrics field "memory"): bytes saved, dropped for and
// refilled by recompute, written to and read back from the swap file, the main thread's wait on
// swap I/O, and the slow tier's peak.
nlohmann::json memory_record(const StoreCounters& before, const StoreCounters& after) {
  return {{"saved_bytes", after.saved_bytes - before.saved_bytes},
          {"recompute_dropped_bytes", after.dropped_bytes - before.dropped_bytes},
          {"recomputed_bytes", after.recomputed_bytes - before.recomputed_bytes},
          {"swapped_out_bytes", after.swapped_out_bytes - before.swapped_out_bytes},
          {"swap_read_bytes", after.read_back_bytes - before.read_back_bytes},
          {"swap_wait_s", after.swap_wait_seconds - before.swap_wait_seconds},
          {"peak_slow_bytes", MemoryStats::peak(Tier::slow)}};
}

// Column `column` of a [ranks, width] table gathered from every rank.
std::vector<int64_t> column_of(const std::vector<int64_t>& table, int64_t width, int64_t column) {
  std::vector<int64_t> out;
  for (size_t at = column; at < table.size(); at += width) out.push_back(table[at]);
  return out;
}

// Metrics field "fsdp": this step's bytes moved by the gathers and reduce-scatters and the peak of
// gathered parameters on this rank; the shard's resident state (parameters, gradients and both
// moments) and the elements it gathers to use; and every rank's peak fast-tier and resident bytes
// and its planned peak (a collective: all ranks call it).
template <class T>
nlohmann::json fsdp_record(const ProcessGroup& world, const Fsdp<T>& fsdp, const FsdpCounters& before,
                           int64_t peak_bytes, int64_t planned_peak_bytes) {
  const FsdpCounters& now = fsdp.counters();
  const std::vector<int64_t> memory =
      world.all_gather_values<int64_t>({peak_bytes, peak_rss_bytes(), planned_peak_bytes});  // [ranks, 3]
  return {{"ranks", world.size()},
          {"gathered_bytes", now.gathered_bytes - before.gathered_bytes},
          {"reduce_scattered_bytes", now.reduce_scattered_bytes - before.reduce_scattered_bytes},
          {"peak_gathered_bytes", now.peak_gathered_bytes},
          {"shard_elements", fsdp.shard_size()},
          {"held_elements", fsdp.held_elements()},
          {"shard_state_bytes", 4 * fsdp.shard_size() * static_cast<int64_t>(sizeof(T))},
          {"rank_peak_bytes", column_of(memory, 3, 0)},
          {"rank_peak_rss_bytes", column_of(memory, 3, 1)},
          {"rank_planned_peak_bytes", column_of(memory, 3, 2)}};
}

// Metrics field "expert_parallel": every rank's bytes of this step's dispatches (rows sent to other
// ranks' experts, forward and backward) and combines (rows sent back), and every rank's own routing
// loads per MoE layer ("rank_tokens_per_expert": [layers][ranks][E]), from which the bytes follow;
// a collective.
nlohmann::json expert_parallel_record(const ProcessGroup& world, int ep, const ExpertParallelCounters& now,
                                      const ExpertParallelCounters& before, const StepStats& stats) {
  // One gather per step: [dispatched, combined, every layer's loads] of each rank.
  std::vector<int64_t> mine = {now.dispatched_bytes - before.dispatched_bytes, now.combined_bytes - before.combined_bytes};
  for (const MoeLayerStats& layer : stats.layers())
    mine.insert(mine.end(), layer.rank_tokens_per_expert.begin(), layer.rank_tokens_per_expert.end());
  const int64_t width = static_cast<int64_t>(mine.size());
  const std::vector<int64_t> all = world.all_gather_values(mine);  // [ranks, width]
  nlohmann::json loads = nlohmann::json::array();
  int64_t at = 2;
  for (const MoeLayerStats& layer : stats.layers()) {
    const int64_t E = static_cast<int64_t>(layer.rank_tokens_per_expert.size());
    nlohmann::json per_rank = nlohmann::json::array();
    for (int r = 0; r < world.size(); ++r) {
      per_rank.push_back(std::vector<int64_t>(all.begin() + r * width + at, all.begin() + r * width + at + E));
    }
    loads.push_back(per_rank);
    at += E;
  }
  return {{"ep", ep},
          {"rank_dispatched_bytes", column_of(all, width, 0)},
          {"rank_combined_bytes", column_of(all, width, 1)},
          {"rank_tokens_per_expert", loads}};
}

// train_tokens: the training split's size (0 before the data is known: a dry run).
// rank: whose plan (every rank's differs a little: the shards' sizes, the expert slices).
StepMemoryShape step_memory_shape(const TrainOptions& o, const TrainSettings& s, int64_t train_tokens, int rank) {
  StepMemoryShape shape;
  shape.ranks = ProcessGroup::world().size();
  shape.rank = rank;
  shape.ep = o.ep;
  shape.expert_imbalance = o.expert_imbalance;
  shape.grad_accum = s.grad_accum;
  shape.batch = s.batch / shape.ranks;  // this rank's rows
  shape.seq = s.seq_len;
  shape.element_bytes = s.dtype == "float64" ? 8 : 4;
  shape.indexer.mode = indexer_mode_from_name(s.indexer_mode);
  shape.indexer.coef = s.indexer_loss_coef;
  shape.loss = s.loss_gradients == "recompute" ? LossGradients::recompute : LossGradients::in_forward;
  shape.threads = num_threads();
  shape.policy_min_bytes = o.policy_min_bytes;
  shape.swap_bf16 = o.swap_bf16;
  shape.sampler_windows = train_tokens > 0 ? (train_tokens - 1) / s.seq_len : 0;
  return shape;
}

// The policy the run uses and its plan: --recompute / --swap as given, or, with --memory-budget and
// neither given, the cheapest candidate that fits; a given policy over the budget is an error.
MemoryPlan memory_plan_of(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                          int64_t train_tokens, int rank) {
  const StepMemoryShape shape = step_memory_shape(o, s, train_tokens, rank);
  const bool chosen_by_user = o.recompute != "none" || o.swap != "none";
  if (o.memory_budget.empty() || chosen_by_user) {
    MemoryPlan plan = plan_memory(config, shape, MemoryPolicy{o.recompute, o.swap});
    if (!o.memory_budget.empty() && plan.peak_fast > parse_bytes(o.memory_budget, "--memory-budget"))
      fail("--memory-budget ", o.memory_budget, ": the planned peak of ", plan.policy.name(), " is ", plan.peak_fast,
           " bytes; expected a larger budget, or leave --recompute / --swap to the budget");
    return plan;
  }
  return choose_policy(config, shape, parse_bytes(o.memory_budget, "--memory-budget"));
}

// --dry-run: the plan of the chosen policy (JSON on stdout, lines on stderr) and every candidate's
// peak; under mpirun rank 0 prints them for rank 0 and every rank's plan ("rank_plans").
void print_memory_plan(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                       int64_t train_tokens) {
  const ProcessGroup& world = ProcessGroup::world();
  if (!world.is_root()) return;
  const MemoryPlan plan = memory_plan_of(o, config, s, train_tokens, 0);
  nlohmann::json json = plan.to_json();
  nlohmann::json candidates = nlohmann::json::array();
  const StepMemoryShape shape = step_memory_shape(o, s, train_tokens, 0);
  for (const MemoryPolicy& policy : budget_candidates()) {
    const MemoryPlan other = plan_memory(config, shape, policy);
    candidates.push_back({{"policy", policy.name()}, {"peak_fast", other.peak_fast}, {"peak_slow", other.peak_slow}});
  }
  json["candidates"] = candidates;
  std::fprintf(stderr, "%s\n", plan.describe().c_str());
  if (world.size() > 1) {
    json["rank_plans"] = nlohmann::json::array({json["fast"]});
    for (int rank = 1; rank < world.size(); ++rank) {
      const MemoryPlan other = memory_plan_of(o, config, s, train_tokens, rank);
      json["rank_plans"].push_back(other.to_json()["fast"]);
      std::fprintf(stderr, "%s\n", other.describe().c_str());
    }
  }
  std::printf("%s\n", json.dump(2).c_str());
}

// Refuses a run whose planned peak (the step's or start-up's, whichever is larger), times the ranks
// sharing this machine (OpenMPI's local size), exceeds the memory available, before anything
// large is allocated. Each rank's plan counts its shards, so FSDP runs that fit sharded start.
void require_fits_machine(const MemoryPlan& plan, const ModelConfig& config) {
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int64_t local_ranks = local_size != nullptr ? std::max(1, std::atoi(local_size)) : 1;
  const auto part = [](const char* name, int64_t bytes) { return str_cat(name, " ", human_bytes(double(bytes))); };
  const std::string shards = plan.ranks > 1 ? " (the rank's shards)" : "";
  const std::string where = plan.start_up > plan.peak_fast
      ? str_cat(" at start-up (", part("the whole parameters before sharding", plan.start_up), shards, ")")
      : str_cat(" at its peak (", plan.peak_at, ", ", plan.policy.name(), ": ", part("parameters", plan.parameters),
                ", ", part("gradients", plan.gradients), ", ", part("optimizer state", plan.optimizer_state), shards,
                plan.ranks > 1 ? str_cat(", ", part("gathered units", plan.gathered_at_peak)) : "", ", ",
                part("buffers", plan.model_buffers), ", ", part("activations", plan.activations_at_peak), ", ",
                part("workspace", plan.workspace_at_peak), ")");
  require_memory(std::max(plan.peak_fast, plan.start_up) * local_ranks,
                 str_cat("training ", config.source, local_ranks > 1 ? str_cat(" on ", local_ranks, " local ranks") : ""),
                 str_cat(where, local_ranks > 1 ? " per rank" : ""),
                 "a smaller model, --batch or --seq-len, or less memory through --recompute, --swap or --memory-budget");
}

template <class T>
void train_loop(const TrainOptions& o, RunSetup& run) {
  const TrainSettings& s = run.state.settings;
  const std::string& out_dir = o.out_dir;
  // FSDP over the world (parallel/fsdp.h): every rank draws the whole global batch (the same
  // windows: the sampler's position is global) and trains its rows of each micro-batch; units are
  // gathered around their use and their gradients reduce-scattered into the rank's shard, whose
  // AdamW updates the rank's shard of the parameters. Rank 0 writes metrics, progress and
  // checkpoints. One rank: no Fsdp, its shard is the whole of the flat buffers.
  const ProcessGroup& world = ProcessGroup::world();
  const int64_t ranks = world.size(), local_batch = s.batch / ranks;
  const ParallelMesh mesh(world, o.ep, run.config);  // expert parallelism's groups (parallel/mesh.h)
  // Before anything large is allocated.
  const MemoryPlan plan = memory_plan_of(o, run.config, s, run.data.train_tokens(), world.rank());
  require_fits_machine(plan, run.config);
  Model<T> model(run.config);
  if (run.weights_dir.empty()) {
    model.init_weights(s.seed);
  } else if (!is_sharded_checkpoint(run.weights_dir)) {
    model.load_weights(run.weights_dir);
  }
  if (ranks > 1) {
    model.set_statistics_reduction(
        {world.size(), [&world](double* values, int64_t count) { world.all_reduce_sum(values, count); }});
  }
  Optimizer<T> optimizer(model.table(), world, o.ep);
  if (!run.weights_dir.empty() && is_sharded_checkpoint(run.weights_dir)) {
    // Written by any layout: every rank reads the whole flat state, then keeps its shard.
    Buffer<T> avg(model.table().trainable_size()), avg_sq(model.table().trainable_size());  // [trainable_size]
    read_sharded_checkpoint(run.weights_dir, model.table(), model.params(), avg.data(), avg_sq.data());
    if (run.resumed) optimizer.load_flat(avg.data(), avg_sq.data());
  } else if (run.resumed) {
    optimizer.load((fs::path(run.weights_dir) / "optimizer.safetensors").string());
  }
  std::optional<Fsdp<T>> fsdp;
  if (ranks > 1) {
    fsdp.emplace(model, world, mesh.edp_group(), optimizer.layout());
    model.set_unit_hooks(fsdp->hooks());
  }
  std::optional<ExpertParallel> experts;
  if (o.ep > 1) {
    experts.emplace(mesh.ep_group(), o.ep_chunks);
    model.set_expert_exchange(&*experts);
  }
  T* step_params = fsdp ? fsdp->shard_params() : model.params();
  T* step_grads = fsdp ? fsdp->shard_grads() : model.grads();
  const IndexerMode indexer_mode = indexer_mode_from_name(s.indexer_mode);
  model.set_indexer_training(indexer_mode, s.indexer_loss_coef);
  model.set_loss_gradients(s.loss_gradients == "recompute" ? LossGradients::recompute : LossGradients::in_forward);
  if (s.document_mask) model.set_document_mask(Tokenizer(run.data.first().tokenizer_path).eos_id());
  if (model.sparse_layers() == 0 && (o.given.count("indexer-mode") != 0 || o.given.count("indexer-loss-coef") != 0))
    fail("--indexer-mode / --indexer-loss-coef: the model has no sparse attention layers (deepseek_v32's "
         "indexed_attention); expected neither");
  if (indexer_mode == IndexerMode::warmup) {
    if (!(s.indexer_loss_coef > 0.0)) fail("--indexer-mode warmup trains only the indexers: expected --indexer-loss-coef > 0");
    // DeepSeek-V3.2's warm-up: every tensor but the indexers' stays as it is.
    optimizer.set_trainable([](const ParamSpec& spec) { return is_indexer_tensor(spec.name); });
  }

  ActivationStore& activations = model.activations();
  if (plan.policy.swap != "none") activations.set_swap_directory(o.swap_dir.empty() ? out_dir : o.swap_dir);
  apply_save_policies(activations, plan.policy.recompute, plan.policy.swap);
  activations.set_paged_min_bytes(o.policy_min_bytes);
  activations.set_swap_bf16(o.swap_bf16);
  if (!o.memory_budget.empty()) std::fprintf(stderr, "%s\n", plan.describe().c_str());
  const int64_t budget = o.memory_budget.empty() ? 0 : parse_bytes(o.memory_budget, "--memory-budget");

  MixtureSampler sampler(run.data, s.seq_len, s.seed);
  sampler.set_positions(run.state.sampler_position, run.state.source_positions);
  const LrSchedule schedule{s.lr, s.min_lr_ratio, s.warmup, s.steps};
  AdamWHyper hyper{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay};
  std::optional<MetricsLog> metrics;
  if (world.is_root()) metrics.emplace(out_dir, run.state.step);

  const int64_t start_step = run.state.step;
  const int64_t end_step = o.stop_after > 0 ? std::min(o.stop_after, s.steps) : s.steps;
  const int64_t rows = s.grad_accum * s.batch;
  const int64_t tokens_per_step = rows * s.seq_len;
  const double flops_per_token = model.training_flops_per_token(s.seq_len);
  double gemm_rate = std::is_same_v<T, float> ? measure_sgemm_rate(o.mfu_gemm_size) : 0.0;
  bool ceiling_remeasured = false;
  // Hooks after each optimizer step, with the step's routing statistics.
  std::vector<std::function<void(const StepStats&)>> after_step;
  if (s.moe_bias_rate > 0.0) {
    const std::vector<std::pair<int, T*>> biases = model.correction_biases();
    if (biases.empty())
      fail("--moe-bias-rate ", s.moe_bias_rate, ": the model has no router correction bias (sigmoid routers: ",
           "glm4_moe, deepseek_v3, kimi_linear); expected 0");
    after_step.push_back([biases, rate = s.moe_bias_rate](const StepStats& stats) {
      for (const auto& [layer, bias] : biases)
        for (const MoeLayerStats& layer_stats : stats.layers())
          if (layer_stats.layer == layer) aux_free_bias_update(bias, layer_stats.tokens_per_expert, rate);
    });
  }
  std::vector<int32_t> inputs(rows * s.seq_len), targets(rows * s.seq_len);  // [grad_accum·batch, seq_len] each

  // Sharded: every rank writes its shard into rank 0's temporary directory, rank 0 the rest.
  const auto write_run_files = [&](const std::string& temp_dir) {
    write_file_atomic((fs::path(temp_dir) / "config.json").string(), run.config.to_json().dump(2) + "\n");
    const std::string& tokenizer = run.data.first().tokenizer_path;  // tokenizer.model or tokenizer.json
    write_file_atomic((fs::path(temp_dir) / fs::path(tokenizer).filename()).string(), read_file(tokenizer));
    write_file_atomic((fs::path(temp_dir) / "trainer_state.json").string(), run.state.to_json().dump(2) + "\n");
  };
  auto save_sharded = [&](int64_t step) {
    const auto write_shard = [&](std::string temp_dir) {
      world.broadcast(temp_dir);
      write_checkpoint_shard(temp_dir, optimizer.layout(), fsdp->shard_params(), optimizer.exp_avg(),
                             optimizer.exp_avg_sq());
      world.barrier();  // every rank's file is complete
    };
    if (!world.is_root()) return write_shard(std::string());
    const std::string dir = write_checkpoint(out_dir, step, [&](const std::string& temp_dir) {
      fs::create_directories(fs::path(temp_dir) / "shards");
      write_shard(temp_dir);
      write_checkpoint_index(temp_dir, model.table(), ranks, o.ep, model.params());
      write_run_files(temp_dir);
    });
    prune_checkpoints(out_dir, step, o.keep_last);
    std::fprintf(stderr, "saved %s (sharded over %lld ranks)\n", dir.c_str(), static_cast<long long>(ranks));
  };
  // Every rank takes part (FSDP gathers the parameters and the moments); rank 0 writes.
  auto save = [&](int64_t step) {
    if (metrics) metrics->sync();  // a checkpoint that survives a power loss has its metrics lines too
    if (fsdp && o.sharded_checkpoints) return save_sharded(step);
    if (fsdp) fsdp->gather_everything();
    if (!world.is_root()) {
      optimizer.save(std::string());
      if (fsdp) fsdp->release_everything();
      return;
    }
    const std::string dir = write_checkpoint(out_dir, step, [&](const std::string& temp_dir) {
      model.save_weights(temp_dir);
      optimizer.save((fs::path(temp_dir) / "optimizer.safetensors").string());
      write_run_files(temp_dir);
    });
    if (fsdp) fsdp->release_everything();
    prune_checkpoints(out_dir, step, o.keep_last);
    std::fprintf(stderr, "saved %s\n", dir.c_str());
  };

  const Clock::time_point run_start = Clock::now();
  const double elapsed_before = run.state.elapsed_s;

  // Rank 0's part of a step's end: MFU, the validation loss, the metrics line, the progress line.
  auto report = [&](int64_t step, double loss, double grad_norm, double tokens_per_s,
                    const std::optional<EvalResult>& eval, nlohmann::json& record) {
    ProgressLine progress{step, s.steps, loss, hyper.lr, grad_norm, tokens_per_s};
    if (flops_per_token > 0 && gemm_rate > 0) {
      // The machine's ceiling: each rank's process measures its own (at its thread count).
      const auto mfu_at = [&](double rate) { return flops_per_token * tokens_per_s / (rate * double(ranks)); };
      progress.mfu = mfu_at(gemm_rate);
      if (progress.mfu > 1.0 && !ceiling_remeasured) {  // start-up ran on a busy machine: measure once more
        gemm_rate = std::max(gemm_rate, measure_sgemm_rate(o.mfu_gemm_size));
        ceiling_remeasured = true;
        progress.mfu = mfu_at(gemm_rate);
      }
      progress.mfu_ceiling_stale = progress.mfu > 1.0;
      if (progress.mfu_ceiling_stale) record["mfu_ceiling_stale"] = true;
      record["mfu"] = progress.mfu;
    }
    if (eval) {
      progress.val_loss = eval->loss();
      record["val_loss"] = eval->loss();
      record["val_tokens"] = eval->target_count;
    }
    metrics->append(record);
    const double mean_step_s = seconds_since(run_start) / static_cast<double>(step - start_step);
    progress.eta_s = mean_step_s * static_cast<double>(end_step - step);
    if (step % std::max<int64_t>(o.log_every, 1) == 0 || step == end_step) {
      std::fprintf(stderr, "%s\n", format_progress(progress).c_str());
    }
  };

  const StopSignals stop_signals;
  NumericGuard guard{on_nonfinite_from_name(o.on_nonfinite), o.max_nonfinite_skips, o.check_numerics};
  model.set_check_numerics(o.check_numerics);
  const NanInjection nan_injection = nan_injection_from_environment();
  for (int64_t step = start_step + 1; step <= end_step; ++step) {
    const Clock::time_point step_start = Clock::now();
    MemoryStats::reset_peak(Tier::fast);
    MemoryStats::reset_peak(Tier::slow);
    const StoreCounters counters_before = activations.counters();
    reset_peak_rss();  // where allowed: the step's resident peak, not start-up's
    sampler.next_batch(inputs.data(), targets.data(), rows);
    const int64_t count = std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; });
    // A step whose micro-batches hold no counted target has no loss to follow: the weights stay.
    const bool skipped = count == 0;
    const LossScales scales{skipped ? 0.0 : 1.0 / static_cast<double>(count), 1.0 / static_cast<double>(s.grad_accum)};
    double loss_sum = 0.0, grad_norm = 0.0;
    StepStats stats;
    const FsdpCounters fsdp_before = fsdp ? fsdp->counters() : FsdpCounters{};
    const ExpertParallelCounters experts_before = experts ? experts->counters() : ExpertParallelCounters{};
    if (fsdp) fsdp->reset_peak();
    hyper.lr = schedule.at(step);
    std::string nonfinite;  // a dropped non-finite step: what went wrong (numeric_guard.h)
    if (!skipped) {
      model.inject_nan_after_layer(step == nan_injection.step ? nan_injection.layer : -1);
      std::string first_output;  // --check-numerics: the first non-finite sublayer output
      for (int64_t micro = 0; micro < s.grad_accum; ++micro) {
        const int64_t at = (micro * s.batch + world.rank() * local_batch) * s.seq_len;  // this rank's rows
        if (fsdp) fsdp->set_last_micro_batch(micro + 1 == s.grad_accum);
        const StepResult result =
            model.forward_backward(inputs.data() + at, targets.data() + at, local_batch, s.seq_len, scales);
        loss_sum += result.lm.loss_sum;
        if (first_output.empty()) first_output = result.first_nonfinite_output;
        stats.add(result);
      }
      if (ranks > 1) loss_sum = world.all_reduce_sum(loss_sum);
      grad_norm = optimizer.global_grad_norm(step_grads);
      nonfinite = guard.check(step, loss_sum * scales.lm, grad_norm, first_output, model.table(), optimizer.layout(),
                              step_grads, world);
      if (nonfinite.empty()) optimizer.step(step_params, step_grads, step, hyper, clip_factor(grad_norm, s.clip));
      if (!fsdp) model.zero_grads();  // FSDP released (zeroed) each unit's gradients after reducing them
      if (nonfinite.empty()) {
        for (const auto& hook : after_step) hook(stats);
      } else {
        ++run.state.nonfinite_skips;
        if (world.is_root()) std::fprintf(stderr, "skipped (--on-nonfinite skip): %s\n", nonfinite.c_str());
      }
    }
    const double lm_loss = loss_sum * scales.lm;
    const double loss = lm_loss + stats.aux_objective();
    const double step_s = seconds_since(step_start);
    const int64_t peak_bytes = MemoryStats::peak(Tier::fast);

    run.state.step = step;
    run.state.sampler_position = sampler.position();
    if (run.data.dirs.size() > 1) run.state.source_positions = sampler.source_positions();
    run.state.tokens_seen += tokens_per_step;
    run.state.elapsed_s = elapsed_before + seconds_since(run_start);
    const double tokens_per_s = tokens_per_step / std::max(step_s, 1e-9);
    nlohmann::json record = {{"step", step},
                             {"loss", skipped ? nlohmann::json() : nlohmann::json(loss)},
                             {"lm_loss", skipped ? nlohmann::json() : nlohmann::json(lm_loss)},
                             {"lr", hyper.lr},
                             {"grad_norm", grad_norm},
                             {"tokens", run.state.tokens_seen},
                             {"tokens_per_s", tokens_per_s},
                             {"elapsed_s", run.state.elapsed_s},
                             {"peak_bytes", peak_bytes},
                             {"peak_rss_bytes", peak_rss_bytes()}};
    record["memory"] = memory_record(counters_before, activations.counters());
    record["memory"]["policy"] = plan.policy.name();
    if (activations.swap_engine() != nullptr)
      record["memory"]["swap_io"] = activations.swap_engine()->direct_io() ? "O_DIRECT" : "buffered, synced, fadvised";
    record["memory"]["planned_peak_bytes"] = plan.peak_fast;
    if (budget > 0) record["memory"]["budget_bytes"] = budget;
    if (skipped) record["skipped"] = "no counted targets in the step's micro-batches; weights unchanged";
    if (!nonfinite.empty()) {
      record["skipped"] = "not finite; the update was dropped: " + nonfinite;
      record["loss"] = record["lm_loss"] = nullptr;
    }
    if (run.state.nonfinite_skips > 0) record["nonfinite_skips"] = run.state.nonfinite_skips;
    stats.write_metrics(record);
    if (fsdp) record["fsdp"] = fsdp_record(world, *fsdp, fsdp_before, peak_bytes, plan.peak_fast);
    if (experts) {
      record["expert_parallel"] = expert_parallel_record(world, o.ep, experts->counters(), experts_before, stats);
    }
    std::optional<EvalResult> eval;  // every rank evaluates the same windows (FSDP gathers the units)
    if (o.eval_every > 0 && (step % o.eval_every == 0 || step == s.steps)) {
      eval = evaluate_loss(model, run.data.val_streams(), s.seq_len, s.batch, o.eval_batches);
    }
    if (world.is_root()) report(step, loss, grad_norm, tokens_per_s, eval, record);
    // Preemption (train/stop_signals.h): a signal on any rank stops every rank after this step.
    const bool stop = step < end_step && stop_signals.stop_requested(world);
    if (step == end_step || stop || (o.save_every > 0 && step % o.save_every == 0)) save(step);
    if (stop) {
      if (world.is_root())
        std::fprintf(stderr, "stopped after step %lld (%s); continue with: trillion train --resume %s\n",
                     static_cast<long long>(step),
                     stop_signals.received() != 0 ? strsignal(stop_signals.received()) : "another rank was signalled",
                     out_dir.c_str());
      return;
    }
  }
}

}  // namespace

void run_training(TrainOptions options) {
  if (options.dry_run) {
    if (options.config_path.empty()) fail("--dry-run needs --config MODEL.json");
    validate_settings(options.settings);
    const ModelConfig config = ModelConfig::load(options.config_path);
    // With --data, the sampler's share is counted too.
    const int64_t train_tokens = options.data_dir.empty() ? 0
        : open_data_mixture(options.data_dir, config.vocab_size).train_tokens();
    print_memory_plan(options, config, options.settings, train_tokens);
    return;
  }
  ProcessGroup::world().set_collective_timeout(options.collective_timeout_s);
  RunSetup run = prepare_run(options);
  if (run.state.settings.dtype == "float64") {
    train_loop<double>(options, run);
  } else {
    train_loop<float>(options, run);
  }
}

}  // namespace trillion
