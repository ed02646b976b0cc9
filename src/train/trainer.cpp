// The training loop of `trillion train` (see trainer.h): a Trainer sets a run up, steps it,
// records each step and saves its checkpoints.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "bench/physical_peak.h"
#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "data/mixture.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "memory/save_policies.h"
#include "model/lightning_indexer.h"
#include "model/model.h"
#include "ops/adamw.h"
#include "ops/gemm.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/parallel_plan.h"
#include "parallel/process_group.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/moe_balance.h"
#include "train/numeric_guard.h"
#include "train/optimizer.h"
#include "train/run_setup.h"
#include "train/sharded_checkpoint.h"
#include "train/step_records.h"
#include "train/stop_signals.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What one optimizer step did, for its metrics line.
struct StepOutcome {
  bool skipped = false;   // no counted target in the step's micro-batches: the weights stay
  std::string nonfinite;  // a dropped non-finite step: what went wrong (numeric_guard.h)
  double lm_loss = 0.0, grad_norm = 0.0, seconds = 0.0;
  StepStats stats;
  StoreCounters store_before;
  FsdpCounters fsdp_before;
  ExpertParallelCounters experts_before;
  ContextTraffic context_before;
};

// FSDP over the world (parallel/fsdp.h): every rank draws the whole global batch (the same
// windows: the sampler's position is global) and trains its rows of each micro-batch (with --cp,
// its context-parallel group's rows, of which it holds its tokens: parallel/context_parallel.h);
// units are gathered around their use and their gradients reduce-scattered into the rank's shard,
// whose AdamW updates the rank's shard of the parameters. Rank 0 writes metrics, progress and
// checkpoints. One rank: no Fsdp, its shard is the whole of the flat buffers.
template <class T>
class Trainer {
 public:
  Trainer(const TrainOptions& o, RunSetup& run);
  // Steps until the run's end, --stop-after or a stop signal, checkpointing when due.
  void run();

 private:
  void load_weights();
  void set_up_parallelism();
  void set_up_training_modes();
  StepOutcome step(int64_t step, NumericGuard& guard, const NanInjection& nan_injection);
  nlohmann::json record(int64_t step, const StepOutcome& outcome);
  void report(int64_t step, double loss, double grad_norm, double tokens_per_s, const std::optional<EvalResult>& eval,
              nlohmann::json& record);
  void save(int64_t step);
  void save_sharded(int64_t step);
  void write_run_files(const std::string& temp_dir) const;

  const TrainOptions& o_;
  RunSetup& run_;
  const TrainSettings& s_;
  const ProcessGroup& world_;
  const int64_t ranks_, local_batch_;  // the world's ranks, the rows of a micro-batch this rank trains
  const ParallelMesh mesh_;            // expert and context parallelism's groups (parallel/mesh.h)
  const MemoryPlan plan_;    // checked against the machine before anything large is allocated
  Model<T> model_;
  Optimizer<T> optimizer_;
  std::optional<ParallelPlan<T>> parallel_;  // the mesh applied to the model (parallel/parallel_plan.h)
  int64_t budget_ = 0;  // --memory-budget in bytes (0: none)
  std::optional<MixtureSampler> sampler_;  // made once the model and its modes are set up
  LrSchedule schedule_;
  AdamWHyper hyper_;
  std::optional<MetricsLog> metrics_;  // rank 0's
  int64_t start_step_ = 0, end_step_ = 0, rows_ = 0, tokens_per_step_ = 0;
  double flops_per_token_ = 0.0, gemm_rate_ = 0.0, peak_rate_ = 0.0;
  bool ceiling_remeasured_ = false;
  // Hooks after each optimizer step, with the step's routing statistics.
  std::vector<std::function<void(const StepStats&)>> after_step_;
  std::vector<int32_t> inputs_, targets_;  // [grad_accum·batch, seq_len] each
  // With --cp: this rank's tokens of a micro-batch's rows, [local_batch, its tokens per row] each.
  std::vector<int32_t> local_inputs_, local_targets_;
  Clock::time_point run_start_;
  double elapsed_before_ = 0.0;
};

template <class T>
Trainer<T>::Trainer(const TrainOptions& o, RunSetup& run)
    : o_(o),
      run_(run),
      s_(run.state.settings),
      world_(ProcessGroup::world()),
      ranks_(world_.size()),
      local_batch_(ParallelMesh::rows_per_rank(s_.batch, world_.size() / o.cp, "--batch")),
      mesh_(world_, o.ep, run.config, o.cp),
      plan_([&] {
        MemoryPlan plan = memory_plan_of(o, run.config, s_, run.data.train_tokens(), world_.size(), world_.rank());
        require_fits_machine(plan, run.config);
        return plan;
      }()),
      model_(run.config),
      optimizer_(model_.table(), world_, o.ep),
      schedule_{s_.lr, s_.min_lr_ratio, s_.warmup, s_.steps},
      hyper_{s_.lr, s_.beta1, s_.beta2, s_.eps, s_.weight_decay} {
  load_weights();
  if (keeps_bf16_only_base(model_.config(), ranks_, sizeof(T), matmul_precision() == MatmulPrecision::bf16))
    model_.keep_frozen_base_in_bf16_only();
  if (model_.config().lora != nullptr && world_.is_root()) {
    const ParamTable& table = model_.table();
    const ParamCounts counts = count_parameters(model_.config());
    std::fprintf(stderr, "LoRA: %lld trainable parameters of %lld (%.3f %%); gradients %lld bytes, AdamW moments %lld\n",
                 static_cast<long long>(counts.trainable), static_cast<long long>(counts.with_adapters),
                 100.0 * double(counts.trainable) / double(counts.with_adapters),
                 static_cast<long long>(table.trainable_size() * sizeof(T)),
                 static_cast<long long>(2 * table.trainable_size() * sizeof(T)));
    if (model_.released_base_bytes() > 0)
      std::fprintf(stderr, "LoRA: the frozen base's linear weights in bf16 only (%lld float bytes released)\n",
                   static_cast<long long>(model_.released_base_bytes()));
  }
  set_up_parallelism();
  set_up_training_modes();
  sampler_.emplace(run.data, s_.seq_len, s_.seed);
  sampler_->set_positions(run.state.sampler_position, run.state.source_positions);
  if (world_.is_root()) metrics_.emplace(o.out_dir, run.state.step);
  start_step_ = run.state.step;
  end_step_ = o.stop_after > 0 ? std::min(o.stop_after, s_.steps) : s_.steps;
  rows_ = s_.grad_accum * s_.batch;
  tokens_per_step_ = rows_ * s_.seq_len;
  flops_per_token_ = model_.training_flops_per_token(s_.seq_len);
  gemm_rate_ = std::is_same_v<T, float> ? measure_sgemm_rate(o.mfu_gemm_size) : 0.0;
  peak_rate_ = std::is_same_v<T, float> ? measure_physical_peak().flops(matmul_precision()) : 0.0;
  if (s_.moe_bias_rate > 0.0) {
    const std::vector<std::pair<int, T*>> biases = model_.correction_biases();
    if (biases.empty())
      fail("--moe-bias-rate ", s_.moe_bias_rate, ": the model has no router correction bias (sigmoid routers: ",
           "glm4_moe, deepseek_v3, kimi_linear); expected 0");
    after_step_.push_back([biases, rate = s_.moe_bias_rate](const StepStats& stats) {
      for (const auto& [layer, bias] : biases)
        for (const MoeLayerStats& layer_stats : stats.layers())
          if (layer_stats.layer == layer) aux_free_bias_update(bias, layer_stats.tokens_per_expert, rate);
    });
  }
  inputs_.resize(rows_ * s_.seq_len);
  targets_.resize(rows_ * s_.seq_len);
  if (const ContextParallel* context = parallel_->context()) {
    local_inputs_.resize(local_batch_ * context->split().local_len(context->rank()));
    local_targets_.resize(local_inputs_.size());
  }
}

// Seeded initialization, the weights of --init / --resume, a LoRA run's adapter, and a resumed
// run's optimizer moments. A LoRA run starting from weights draws its new adapter from the seed
// (A kaiming-uniform, B zero) before they load the base.
template <class T>
void Trainer<T>::load_weights() {
  if (run_.weights_dir.empty() || model_.config().lora != nullptr) model_.init_weights(s_.seed);
  if (!run_.weights_dir.empty() && !is_sharded_checkpoint(run_.weights_dir)) model_.load_weights(run_.weights_dir);
  if (!run_.adapter_dir.empty()) model_.load_adapter(run_.adapter_dir);
  if (!run_.weights_dir.empty() && is_sharded_checkpoint(run_.weights_dir)) {
    // Written by any layout: every rank reads the whole flat state, then keeps its shard.
    Buffer<T> avg(model_.table().trainable_size()), avg_sq(model_.table().trainable_size());  // [trainable_size]
    read_sharded_checkpoint(run_.weights_dir, model_.table(), model_.params(), avg.data(), avg_sq.data());
    if (run_.resumed) optimizer_.load_flat(avg.data(), avg_sq.data());
  } else if (run_.resumed) {
    optimizer_.load((fs::path(run_.weights_dir) / "optimizer.safetensors").string());
  }
}

// The statistics reduction over the ranks, FSDP's hooks, the expert exchange, the sequence split.
template <class T>
void Trainer<T>::set_up_parallelism() {
  parallel_.emplace(model_, mesh_, optimizer_.layout(), o_.ep_chunks, s_.seq_len);
}

// The indexer's stage, the loss's gradients, document masks, and the activation store's policy.
template <class T>
void Trainer<T>::set_up_training_modes() {
  const IndexerMode indexer_mode = indexer_mode_from_name(s_.indexer_mode);
  model_.set_indexer_training(indexer_mode, s_.indexer_loss_coef);
  model_.set_loss_gradients(s_.loss_gradients == "recompute" ? LossGradients::recompute : LossGradients::in_forward);
  if (s_.document_mask) model_.set_document_mask(Tokenizer(run_.data.first().tokenizer_path).eos_id());
  if (model_.sparse_layers() == 0 && (o_.given.count("indexer-mode") != 0 || o_.given.count("indexer-loss-coef") != 0))
    fail("--indexer-mode / --indexer-loss-coef: the model has no sparse attention layers (deepseek_v32's "
         "indexed_attention); expected neither");
  if (indexer_mode == IndexerMode::warmup) {
    if (!(s_.indexer_loss_coef > 0.0)) fail("--indexer-mode warmup trains only the indexers: expected --indexer-loss-coef > 0");
    // DeepSeek-V3.2's warm-up: every tensor but the indexers' stays as it is.
    optimizer_.set_trainable([](const ParamSpec& spec) { return is_indexer_tensor(spec.name); });
  }
  ActivationStore& activations = model_.activations();
  if (plan_.policy.swap != "none") activations.set_swap_directory(o_.swap_dir.empty() ? o_.out_dir : o_.swap_dir);
  apply_save_policies(activations, plan_.policy.recompute, plan_.policy.swap);
  activations.set_paged_min_bytes(o_.policy_min_bytes);
  activations.set_swap_bf16(o_.swap_bf16);
  if (!o_.memory_budget.empty()) std::fprintf(stderr, "%s\n", plan_.describe().c_str());
  budget_ = o_.memory_budget.empty() ? 0 : parse_bytes(o_.memory_budget, "--memory-budget");
}

template <class T>
void Trainer<T>::run() {
  run_start_ = Clock::now();
  elapsed_before_ = run_.state.elapsed_s;
  const StopSignals stop_signals;
  NumericGuard guard{on_nonfinite_from_name(o_.on_nonfinite), o_.max_nonfinite_skips, o_.check_numerics};
  model_.set_check_numerics(o_.check_numerics);
  const NanInjection nan_injection = nan_injection_from_environment();
  for (int64_t step = start_step_ + 1; step <= end_step_; ++step) {
    const StepOutcome outcome = this->step(step, guard, nan_injection);
    nlohmann::json line = record(step, outcome);
    // Every rank evaluates the same windows (FSDP gathers the units), under --cp its tokens of them.
    std::optional<EvalResult> eval;
    if (o_.eval_every > 0 && (step % o_.eval_every == 0 || step == s_.steps)) {
      eval =
          evaluate_loss(model_, run_.data.val_streams(), s_.seq_len, s_.batch, o_.eval_batches, parallel_->context());
    }
    if (world_.is_root()) {
      report(step, outcome.lm_loss + outcome.stats.aux_objective(), outcome.grad_norm,
             tokens_per_step_ / std::max(outcome.seconds, 1e-9), eval, line);
    }
    // Preemption (train/stop_signals.h): a signal on any rank stops every rank after this step.
    const bool stop = step < end_step_ && stop_signals.stop_requested(world_);
    if (step == end_step_ || stop || (o_.save_every > 0 && step % o_.save_every == 0)) save(step);
    if (stop) {
      if (world_.is_root())
        std::fprintf(stderr, "stopped after step %lld (%s); continue with: trillion train --resume %s\n",
                     static_cast<long long>(step),
                     stop_signals.received() != 0 ? strsignal(stop_signals.received()) : "another rank was signalled",
                     o_.out_dir.c_str());
      return;
    }
  }
}

// One optimizer step over grad_accum micro-batches: this rank's rows of each, the global norm, the
// numeric guard, AdamW on the shard, the after-step hooks; the trainer state advanced.
template <class T>
StepOutcome Trainer<T>::step(int64_t step, NumericGuard& guard, const NanInjection& nan_injection) {
  const Clock::time_point step_start = Clock::now();
  MemoryStats::reset_peak(Tier::fast);
  MemoryStats::reset_peak(Tier::slow);
  StepOutcome outcome;
  outcome.store_before = model_.activations().counters();
  reset_peak_rss();  // where allowed: the step's resident peak, not start-up's
  sampler_->next_batch(inputs_.data(), targets_.data(), rows_);
  const int64_t count = std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t != kIgnoreIndex; });
  // A step whose micro-batches hold no counted target has no loss to follow: the weights stay.
  outcome.skipped = count == 0;
  const LossScales scales{outcome.skipped ? 0.0 : 1.0 / static_cast<double>(count),
                          1.0 / static_cast<double>(s_.grad_accum)};
  double loss_sum = 0.0;
  Fsdp<T>* fsdp = parallel_->fsdp();                 // null on one rank
  ExpertParallel* experts = parallel_->experts();  // null without --ep
  if (fsdp) {
    outcome.fsdp_before = fsdp->counters();
    fsdp->reset_peak();
  }
  if (experts) outcome.experts_before = experts->counters();
  ContextParallel* context = parallel_->context();  // null without --cp
  if (context) outcome.context_before = context->traffic();
  hyper_.lr = schedule_.at(step);
  if (!outcome.skipped) {
    model_.inject_nan_after_layer(step == nan_injection.step ? nan_injection.layer : -1);
    std::string first_output;  // --check-numerics: the first non-finite sublayer output
    struct ClearDropoutPass {  // evaluation draws no masks, however the micro-batches end
      Model<T>& model;
      ~ClearDropoutPass() { model.set_lora_dropout(std::nullopt); }
    } clear_dropout{model_};
    for (int64_t micro = 0; micro < s_.grad_accum; ++micro) {
      const int64_t at = (micro * s_.batch + mesh_.data_share() * local_batch_) * s_.seq_len;  // this rank's rows
      if (fsdp) fsdp->set_last_micro_batch(micro + 1 == s_.grad_accum);
      LoraDropoutPass dropout{.seed = s_.seed, .step = step, .first_token = at};
      const int32_t* inputs = inputs_.data() + at;  // [local_batch, held]
      const int32_t* targets = targets_.data() + at;
      int64_t held = s_.seq_len;  // tokens per row
      if (context) {              // this rank's tokens of its rows
        const ContextSplit& split = context->split();
        split.take_local(local_inputs_.data(), inputs, local_batch_, context->rank());
        split.take_local(local_targets_.data(), targets, local_batch_, context->rank());
        inputs = local_inputs_.data();
        targets = local_targets_.data();
        held = split.local_len(context->rank());
        const int32_t* positions = context->positions(held);  // [held], the exchange's own
        dropout.positions.assign(positions, positions + held);
        dropout.seq = s_.seq_len;
      }
      model_.set_lora_dropout(dropout);
      const StepResult result = model_.forward_backward(inputs, targets, local_batch_, held, scales);
      loss_sum += result.lm.loss_sum;
      if (first_output.empty()) first_output = result.first_nonfinite_output;
      outcome.stats.add(result);
    }
    if (ranks_ > 1) loss_sum = world_.all_reduce_sum(loss_sum);
    outcome.grad_norm = optimizer_.global_grad_norm(parallel_->step_grads());
    outcome.nonfinite = guard.check(step, loss_sum * scales.lm, outcome.grad_norm, first_output, model_.table(),
                                    optimizer_.layout(), parallel_->step_grads(), world_);
    if (outcome.nonfinite.empty())
      optimizer_.step(parallel_->step_params(), parallel_->step_grads(), step, hyper_,
                      clip_factor(outcome.grad_norm, s_.clip));
    if (!fsdp) model_.zero_grads();  // FSDP released (zeroed) each unit's gradients after reducing them
    if (outcome.nonfinite.empty()) {
      for (const auto& hook : after_step_) hook(outcome.stats);
    } else {
      ++run_.state.nonfinite_skips;
      if (world_.is_root()) std::fprintf(stderr, "skipped (--on-nonfinite skip): %s\n", outcome.nonfinite.c_str());
    }
  }
  outcome.lm_loss = loss_sum * scales.lm;
  outcome.seconds = seconds_since(step_start);
  run_.state.step = step;
  run_.state.sampler_position = sampler_->position();
  if (run_.data.dirs.size() > 1) run_.state.source_positions = sampler_->source_positions();
  run_.state.tokens_seen += tokens_per_step_;
  run_.state.elapsed_s = elapsed_before_ + seconds_since(run_start_);
  return outcome;
}

// The step's metrics line; the "fsdp" and "expert_parallel" parts are collectives.
template <class T>
nlohmann::json Trainer<T>::record(int64_t step, const StepOutcome& outcome) {
  const double loss = outcome.lm_loss + outcome.stats.aux_objective();
  const int64_t peak_bytes = MemoryStats::peak(Tier::fast);
  const ActivationStore& activations = model_.activations();
  nlohmann::json line = {{"step", step},
                         {"loss", outcome.skipped ? nlohmann::json() : nlohmann::json(loss)},
                         {"lm_loss", outcome.skipped ? nlohmann::json() : nlohmann::json(outcome.lm_loss)},
                         {"lr", hyper_.lr},
                         {"grad_norm", outcome.grad_norm},
                         {"tokens", run_.state.tokens_seen},
                         {"tokens_per_s", tokens_per_step_ / std::max(outcome.seconds, 1e-9)},
                         {"elapsed_s", run_.state.elapsed_s},
                         {"peak_bytes", peak_bytes},
                         {"peak_rss_bytes", peak_rss_bytes()}};
  line["memory"] = memory_record(outcome.store_before, activations.counters());
  line["memory"]["policy"] = plan_.policy.name();
  if (activations.swap_engine() != nullptr)
    line["memory"]["swap_io"] = activations.swap_engine()->direct_io() ? "O_DIRECT" : "buffered, synced, fadvised";
  line["memory"]["planned_peak_bytes"] = plan_.peak_fast;
  if (budget_ > 0) line["memory"]["budget_bytes"] = budget_;
  if (outcome.skipped) line["skipped"] = "no counted targets in the step's micro-batches; weights unchanged";
  if (!outcome.nonfinite.empty()) {
    line["skipped"] = "not finite; the update was dropped: " + outcome.nonfinite;
    line["loss"] = line["lm_loss"] = nullptr;
  }
  if (run_.state.nonfinite_skips > 0) line["nonfinite_skips"] = run_.state.nonfinite_skips;
  outcome.stats.write_metrics(line);
  if (const Fsdp<T>* fsdp = parallel_->fsdp())
    line["fsdp"] = fsdp_record(world_, *fsdp, outcome.fsdp_before, peak_bytes, plan_.peak_fast);
  if (const ExpertParallel* experts = parallel_->experts())
    line["expert_parallel"] =
        expert_parallel_record(world_, o_.ep, experts->counters(), outcome.experts_before, outcome.stats);
  if (const ContextParallel* context = parallel_->context())
    line["context_parallel"] = context_parallel_record(world_, o_.cp, context->traffic(), outcome.context_before);
  return line;
}

// Rank 0's part of a step's end: MFU, the validation loss, the metrics line, the progress line.
template <class T>
void Trainer<T>::report(int64_t step, double loss, double grad_norm, double tokens_per_s,
                        const std::optional<EvalResult>& eval, nlohmann::json& record) {
  ProgressLine progress{step, s_.steps, loss, hyper_.lr, grad_norm, tokens_per_s};
  if (flops_per_token_ > 0 && gemm_rate_ > 0) {
    // The machine's ceiling: each rank's process measures its own (at its thread count).
    const auto mfu_at = [&](double rate) { return flops_per_token_ * tokens_per_s / (rate * double(ranks_)); };
    progress.mfu = mfu_at(gemm_rate_);
    if (progress.mfu > 1.0 && !ceiling_remeasured_) {  // start-up ran on a busy machine: measure once more
      gemm_rate_ = std::max(gemm_rate_, measure_sgemm_rate(o_.mfu_gemm_size));
      ceiling_remeasured_ = true;
      progress.mfu = mfu_at(gemm_rate_);
    }
    progress.mfu_ceiling_stale = progress.mfu > 1.0;
    if (progress.mfu_ceiling_stale) record["mfu_ceiling_stale"] = true;
    record["mfu"] = progress.mfu;
    progress.mfu_peak = mfu_at(peak_rate_);
    record["mfu_peak"] = progress.mfu_peak;
  }
  if (eval) {
    progress.val_loss = eval->loss();
    record["val_loss"] = eval->loss();
    record["val_tokens"] = eval->target_count;
  }
  metrics_->append(record);
  const double mean_step_s = seconds_since(run_start_) / static_cast<double>(step - start_step_);
  progress.eta_s = mean_step_s * static_cast<double>(end_step_ - step);
  if (step % std::max<int64_t>(o_.log_every, 1) == 0 || step == end_step_) {
    std::fprintf(stderr, "%s\n", format_progress(progress).c_str());
  }
}

// config.json, the tokenizer and trainer_state.json into a checkpoint's temporary directory.
template <class T>
void Trainer<T>::write_run_files(const std::string& temp_dir) const {
  write_file_atomic((fs::path(temp_dir) / "config.json").string(), run_.config.to_json().dump(2) + "\n");
  const std::string& tokenizer = run_.data.first().tokenizer_path;  // tokenizer.model or tokenizer.json
  write_file_atomic((fs::path(temp_dir) / fs::path(tokenizer).filename()).string(), read_file(tokenizer));
  write_file_atomic((fs::path(temp_dir) / "trainer_state.json").string(), run_.state.to_json().dump(2) + "\n");
}

// Sharded: every rank writes its shard (and its frozen shard) into rank 0's temporary directory,
// rank 0 the rest. A LoRA run's adapter/ too (PEFT's files), from the trainable groups gathered
// whole.
template <class T>
void Trainer<T>::save_sharded(int64_t step) {
  Fsdp<T>& fsdp = *parallel_->fsdp();
  const bool lora = model_.config().lora != nullptr;
  const auto write_shard = [&](std::string temp_dir) {
    world_.broadcast(temp_dir);
    const Buffer<T> frozen = fsdp.frozen_shard();  // [frozen shard size]
    write_checkpoint_shard(temp_dir, optimizer_.layout(), fsdp.shard_params(), optimizer_.exp_avg(),
                           optimizer_.exp_avg_sq(), frozen.data());
    world_.barrier();  // every rank's file is complete
  };
  if (lora) fsdp.gather_everything(/*frozen_too=*/false);
  if (!world_.is_root()) {
    if (lora) fsdp.release_everything();
    return write_shard(std::string());
  }
  const std::string dir = write_checkpoint(o_.out_dir, step, [&](const std::string& temp_dir) {
    fs::create_directories(fs::path(temp_dir) / "shards");
    write_shard(temp_dir);
    write_checkpoint_index(temp_dir, model_.table(), ranks_, o_.ep, model_.params());
    write_run_files(temp_dir);
    if (lora) model_.save_adapter((fs::path(temp_dir) / "adapter").string());
  });
  if (lora) {
    model_.save_adapter((fs::path(o_.out_dir) / "adapter").string(),
                        expert_layout_named(s_.expert_layout, "--expert-layout"));
    fsdp.release_everything();
  }
  prune_checkpoints(o_.out_dir, step, o_.keep_last);
  std::fprintf(stderr, "saved %s (sharded over %lld ranks)\n", dir.c_str(), static_cast<long long>(ranks_));
}

// Every rank takes part (FSDP gathers the parameters and the moments); rank 0 writes.
template <class T>
void Trainer<T>::save(int64_t step) {
  if (metrics_) metrics_->sync();  // a checkpoint that survives a power loss has its metrics lines too
  Fsdp<T>* fsdp = parallel_->fsdp();  // null on one rank
  if (fsdp && o_.sharded_checkpoints) return save_sharded(step);
  MemoryStats::reset_peak(Tier::fast);  // the save's own peak, against the plan's checkpoint_save
  if (fsdp) fsdp->gather_everything();
  if (!world_.is_root()) {
    optimizer_.save(std::string());
    if (fsdp) fsdp->release_everything();
    return;
  }
  const std::string dir = write_checkpoint(o_.out_dir, step, [&](const std::string& temp_dir) {
    model_.save_weights(temp_dir);
    if (model_.config().lora != nullptr) model_.save_adapter((fs::path(temp_dir) / "adapter").string());
    optimizer_.save((fs::path(temp_dir) / "optimizer.safetensors").string());
    write_run_files(temp_dir);
  });
  if (model_.config().lora != nullptr)  // for users, in their layout; the checkpoint's as trained, to resume
    model_.save_adapter((fs::path(o_.out_dir) / "adapter").string(),
                        expert_layout_named(s_.expert_layout, "--expert-layout"));
  const int64_t peak = MemoryStats::peak(Tier::fast);
  if (fsdp) fsdp->release_everything();
  prune_checkpoints(o_.out_dir, step, o_.keep_last);
  if (fsdp)
    std::fprintf(stderr, "saved %s (gathered whole: rank 0's peak %lld bytes, planned %lld)\n", dir.c_str(),
                 static_cast<long long>(peak), static_cast<long long>(plan_.checkpoint_save));
  else
    std::fprintf(stderr, "saved %s\n", dir.c_str());
}

}  // namespace

void run_training(TrainOptions options) {
  if (options.dry_run) {
    if (options.config_path.empty()) fail("--dry-run needs --config MODEL.json");
    validate_settings(options.settings, options.cp);
    ModelConfig config = ModelConfig::load(options.config_path);
    config.lora = new_run_lora(options, config);
    check_expert_layout(options.settings.expert_layout, config);
    // With --data, the sampler's share is counted too.
    const int64_t train_tokens = options.data_dir.empty() ? 0
        : open_data_mixture(options.data_dir, config.vocab_size).train_tokens();
    print_memory_plan(options, config, options.settings, train_tokens);
    return;
  }
  ProcessGroup::world().set_collective_timeout(options.collective_timeout_s);
  RunSetup run = prepare_run(options);
  set_matmul_precision(matmul_precision_from_name(run.state.settings.precision, "--precision"));
  if (run.state.settings.dtype == "float64") {
    Trainer<double>(options, run).run();
  } else {
    Trainer<float>(options, run).run();
  }
}

}  // namespace trillion
