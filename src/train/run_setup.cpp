// Set-up of a training run (see run_setup.h).
#include "train/run_setup.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string_view>

#include "core/error.h"
#include "core/machine_memory.h"
#include "core/parallel.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "model/model.h"
#include "parallel/context_parallel.h"
#include "parallel/mesh.h"
#include "parallel/process_group.h"
#include "train/sharded_checkpoint.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

// --config given together with a checkpoint must describe the same model.
void check_same_config(const ModelConfig& given, const std::string& given_path, const ModelConfig& saved,
                       const std::string& saved_path) {
  const nlohmann::json a = given.to_json(), b = saved.to_json();
  if (a == b) return;
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key) || a.at(key) != value) {
      fail(given_path, ": field '", key, "' is ", a.contains(key) ? a.at(key).dump() : std::string("absent"),
           " but the checkpoint's ", saved_path, " has ", value.dump());
    }
  }
  fail(given_path, ": differs from the checkpoint's ", saved_path);
}

}  // namespace

StepMemoryShape step_memory_shape(const TrainOptions& o, const TrainSettings& s, int64_t train_tokens, int ranks,
                                  int rank) {
  StepMemoryShape shape;
  shape.ranks = ranks;
  shape.rank = rank;
  shape.ep = o.ep;
  shape.cp = o.cp;
  shape.expert_imbalance = o.expert_imbalance;
  shape.grad_accum = s.grad_accum;
  shape.batch = s.batch / (shape.ranks / shape.cp);  // this rank's rows (of which it holds its tokens with cp)
  shape.seq = s.seq_len;
  shape.element_bytes = s.dtype == "float64" ? 8 : 4;
  shape.indexer.mode = indexer_mode_from_name(s.indexer_mode);
  shape.indexer.coef = s.indexer_loss_coef;
  shape.loss = s.loss_gradients == "recompute" ? LossGradients::recompute : LossGradients::in_forward;
  shape.threads = num_threads();
  shape.policy_min_bytes = o.policy_min_bytes;
  shape.swap_bf16 = o.swap_bf16;
  shape.bf16_products = s.precision == "bf16";
  shape.sampler_windows = train_tokens > 0 ? (train_tokens - 1) / s.seq_len : 0;
  shape.whole_checkpoints = !o.sharded_checkpoints;
  shape.adapter_layout = expert_layout_named(s.expert_layout, "--expert-layout");
  return shape;
}

void validate_settings(const TrainSettings& s, int cp) {
  if (s.steps < 1) fail("--steps must be ≥ 1, got ", s.steps);
  if (s.dtype != "float32" && s.dtype != "float64") fail("--dtype must be float32 or float64, got ", s.dtype);
  if (s.dtype == "float64" && s.precision != "fp32")
    fail("--precision ", s.precision, " needs --dtype float32: float64 runs keep every operand in double");
  const int ranks = ProcessGroup::world().size();
  if (cp < 1 || ranks % cp != 0) fail("--cp ", cp, " must be ≥ 1 and divide the ", ranks, " ranks");
  ParallelMesh::rows_per_rank(s.batch, ranks / cp, "--batch");
  if (s.seq_len < 1) fail("--seq-len must be ≥ 1, got ", s.seq_len);
  if (cp > 1) ContextSplit(s.seq_len, cp);  // every rank holds two chunks of each sequence
  if (s.grad_accum < 1) fail("--grad-accum must be ≥ 1, got ", s.grad_accum);
  if (!(s.lr > 0)) fail("--lr must be > 0, got ", s.lr);
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) fail("--min-lr-ratio must be in [0, 1], got ", s.min_lr_ratio);
  if (s.warmup < 0) fail("--warmup must be ≥ 0, got ", s.warmup);
  if (!(s.weight_decay >= 0)) fail("--weight-decay must be ≥ 0, got ", s.weight_decay);
  if (!(s.beta1 >= 0 && s.beta1 < 1)) fail("--beta1 must be in [0, 1), got ", s.beta1);
  if (!(s.beta2 >= 0 && s.beta2 < 1)) fail("--beta2 must be in [0, 1), got ", s.beta2);
  if (!(s.eps > 0)) fail("--eps must be > 0, got ", s.eps);
}

MatmulPrecision checkpoint_matmul_precision(const std::string& given, const TrainSettings* saved) {
  const std::string name = !given.empty() ? given : saved != nullptr ? saved->precision : "fp32";
  const MatmulPrecision precision = matmul_precision_from_name(name, "--precision");
  if (precision != MatmulPrecision::fp32 && saved != nullptr && saved->dtype == "float64")
    fail("--precision ", name, " needs a float32 checkpoint; this one's dtype is float64");
  return precision;
}

namespace {

// The run's LoRA adapter, if any: set on run.config, with the adapter directory to load its
// weights from (--adapter, or a resumed run's checkpoint's).
void attach_lora(const TrainOptions& o, RunSetup& run) {
  if (run.resumed) {
    if (o.lora.given())
      fail("--lora-rank / --lora-config / --adapter: a resumed run keeps what its checkpoint trained (",
           run.weights_dir, "); expected none of them");
    run.adapter_dir = attach_adapter(run.config, run.weights_dir, "");
    return;
  }
  run.config.lora = new_run_lora(o, run.config);
  if (run.config.lora == nullptr) return;
  run.adapter_dir = o.lora.adapter_dir;
  if (!run.weights_dir.empty() && is_sharded_checkpoint(run.weights_dir))
    fail(run.weights_dir, ": a sharded checkpoint; a LoRA run starts from whole weights (`trillion export` writes them)");
}

}  // namespace

std::shared_ptr<const LoraConfig> new_run_lora(const TrainOptions& o, const ModelConfig& config) {
  std::optional<LoraConfig> asked = o.lora.config();
  if (!asked) return nullptr;
  LoraConfig lora = std::move(*asked);
  if (o.settings.moe_bias_rate > 0.0)
    fail("--moe-bias-rate ", o.settings.moe_bias_rate, ": would change the frozen base's router biases, which the ",
         "adapter's files do not carry; expected 0 with LoRA");
  if (lora.base_model_name_or_path.empty())
    lora.base_model_name_or_path = !o.init_dir.empty() ? o.init_dir : fs::path(config.source).parent_path().string();
  ModelConfig adapted = config;
  adapted.lora = std::make_shared<const LoraConfig>(std::move(lora));
  if (config.num_experts > 0) {
    const ParamTable table = param_table_of(adapted);
    check_peft_reads_it_alike(*adapted.lora, table, config.model_type);
    // Evaluation, generation and merge read such an adapter (they drop nothing out); training would
    // drop out the other pairs' inputs only.
    if (adapted.lora->lora_dropout > 0.0 && table.num_elements(ParamGroup::expert_lora) > 0)
      fail(adapted.lora->source, ": field \"lora_dropout\": got ", adapted.lora->lora_dropout, " with routed experts' ",
           "adapters, where the engine does not drop out (and PEFT refuses it on target_parameters); expected 0");
  }
  return adapted.lora;
}

void check_expert_layout(const std::string& name, const ModelConfig& config) {
  const ExpertLayout layout = expert_layout_named(name, "--expert-layout");
  if (layout != ExpertLayout::as_trained && config.lora == nullptr)
    fail("--expert-layout ", name, ": the layout of a LoRA run's adapter; expected a LoRA run ",
         "(--lora-rank, --lora-config or --adapter)");
  if (config.lora != nullptr) check_adapter_layout(config, layout);
}

RunSetup prepare_run(TrainOptions& o) {
  RunSetup run;
  std::string config_source = o.config_path;
  if (!o.resume_dir.empty()) {
    if (!o.init_dir.empty()) fail("--resume and --init are exclusive: --resume continues a run, --init starts one");
    run.weights_dir = resolve_checkpoint_dir(o.resume_dir);
    run.resumed = true;
    const std::string state_path = (fs::path(run.weights_dir) / "trainer_state.json").string();
    run.state = TrainerState::load(state_path);
    run.state.settings = resumed_settings(run.state.settings, o.settings, o.given, state_path);
    if (o.data_dir.empty()) o.data_dir = run.state.data_dir;
    if (o.out_dir.empty()) {
      o.out_dir = fs::exists(fs::path(o.resume_dir) / "latest") ? o.resume_dir
                                                                  : fs::path(run.weights_dir).parent_path().string();
    }
  } else {
    run.state.settings = o.settings;
    if (!o.init_dir.empty()) run.weights_dir = resolve_weights_dir(o.init_dir);
    if (o.data_dir.empty()) fail("--data DIR is required (a directory written by `trillion tokenize`, or DIR:W,… a mixture)");
    if (o.out_dir.empty()) fail("--out DIR is required");
    if (fs::exists(fs::path(o.out_dir) / "latest")) {
      fail(o.out_dir, ": already holds a training run (", o.out_dir, "/latest); continue it with --resume ", o.out_dir,
           " or choose another --out");
    }
  }
  validate_settings(run.state.settings, o.cp);
  if (o.mfu_gemm_size < 1) fail("--mfu-gemm-size must be ≥ 1, got ", o.mfu_gemm_size);
  const TrainSettings& s = run.state.settings;

  const std::string checkpoint_config =
      run.weights_dir.empty() ? std::string() : (fs::path(run.weights_dir) / "config.json").string();
  if (o.config_path.empty()) {
    if (checkpoint_config.empty()) fail("--config MODEL.json is required for a new run");
    run.config = ModelConfig::load(checkpoint_config);
  } else {
    run.config = ModelConfig::load(o.config_path);
    if (run.resumed) check_same_config(run.config, o.config_path, ModelConfig::load(checkpoint_config), checkpoint_config);
  }
  attach_lora(o, run);
  check_expert_layout(s.expert_layout, run.config);
  if (s.seq_len > run.config.max_position_embeddings) {
    fail("--seq-len ", s.seq_len, " exceeds the model's max_position_embeddings ", run.config.max_position_embeddings);
  }

  run.data = open_data_mixture(o.data_dir, run.config.vocab_size);
  const DataDir& data = run.data.first();  // its tokenizer is every source's
  // A checkpoint (resumed, or the weights of --init) must have been trained with the data's tokenizer.
  const fs::path state_path = run.weights_dir.empty() ? fs::path() : fs::path(run.weights_dir) / "trainer_state.json";
  if (!state_path.empty() && fs::exists(state_path) &&
      TrainerState::load(state_path.string()).tokenizer_hash != data.train.tokenizer_hash) {
    fail(state_path.string(), ": field 'tokenizer_hash' does not match the tokenizer of ", data.train.path,
         "; the checkpoint was trained with a different tokenizer");
  }
  // A resumed run continues the sampler's position in the same token stream.
  if (run.resumed && run.state.train_checksum != run.data.train_checksum()) {
    fail(state_path.string(), ": field 'train_checksum' is ", hex64(run.state.train_checksum), " but ",
         run.data.dirs.size() == 1 ? data.train.path : "the mixture " + o.data_dir, " has checksum ",
         hex64(run.data.train_checksum()), "; resume with the data the run was trained on");
  }
  if (run.resumed && run.state.source_positions.size() != (run.data.dirs.size() > 1 ? run.data.dirs.size() : 0)) {
    fail(state_path.string(), ": field 'source_positions' has ", run.state.source_positions.size(),
         " entries for a --data of ", run.data.dirs.size(), " directories");
  }
  for (const DataDir& dir : run.data.dirs) {
    const int64_t train_tokens = dir.train.token_count();
    if (train_tokens < s.seq_len + 1) {
      fail(dir.train.path, ": token_count ", train_tokens, " is too small for --seq-len ", s.seq_len,
           " (needs at least ", s.seq_len + 1, ")");
    }
    if (o.eval_every > 0 && dir.val.token_count() < 2) fail(dir.val.path, ": needs at least 2 tokens for --eval-every");
  }
  if (run.resumed && run.state.step >= s.steps) {
    fail(run.weights_dir, ": the run already finished (step ", run.state.step, " of --steps ", s.steps,
         "); pass a larger --steps to continue it");
  }
  if (o.stop_after > 0 && o.stop_after <= run.state.step) {
    fail("--stop-after ", o.stop_after, " is not after the resumed step ", run.state.step);
  }
  run.state.tokenizer_hash = data.train.tokenizer_hash;
  run.state.train_checksum = run.data.train_checksum();
  run.state.data_dir = format_data_mixture(run.data.sources);
  if (ProcessGroup::world().is_root()) fs::create_directories(o.out_dir);
  return run;
}

// The policy the run uses and its plan: --recompute / --swap as given, or, with --memory-budget and
// neither given, the cheapest candidate that fits; a given policy over the budget is an error.
MemoryPlan memory_plan_of(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                          int64_t train_tokens, int ranks, int rank, const ParamTable* table) {
  const StepMemoryShape shape = step_memory_shape(o, s, train_tokens, ranks, rank);
  const ParamTable built = table != nullptr ? ParamTable() : param_table_of(config);
  if (table == nullptr) table = &built;
  const bool chosen_by_user = o.recompute != "none" || o.swap != "none";
  if (o.memory_budget.empty() || chosen_by_user) {
    MemoryPlan plan = plan_memory(config, *table, shape, MemoryPolicy{o.recompute, o.swap});
    require_no_mixer_reruns(plan, shape.cp);
    if (!o.memory_budget.empty() && plan.peak_fast > parse_bytes(o.memory_budget, "--memory-budget"))
      fail("--memory-budget ", o.memory_budget, ": the planned peak of ", plan.policy.name(), " is ", plan.peak_fast,
           " bytes; expected a larger budget, or leave --recompute / --swap to the budget");
    return plan;
  }
  return choose_policy(config, *table, shape, parse_bytes(o.memory_budget, "--memory-budget"));
}

// --dry-run: the plan of the chosen policy (JSON on stdout, lines on stderr) and every candidate's
// peak; under mpirun rank 0 prints them for rank 0 and every rank's plan ("rank_plans").
void print_memory_plan(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                       int64_t train_tokens) {
  const ProcessGroup& world = ProcessGroup::world();
  if (!world.is_root()) return;
  ParallelMesh::validate(world.size(), o.ep, config, o.cp);
  const MemoryPlan plan = memory_plan_of(o, config, s, train_tokens, world.size(), 0);
  nlohmann::json json = plan.to_json();
  nlohmann::json candidates = nlohmann::json::array();
  const StepMemoryShape shape = step_memory_shape(o, s, train_tokens, world.size(), 0);
  for (const MemoryPolicy& policy : budget_candidates()) {
    const MemoryPlan other = plan_memory(config, shape, policy);
    candidates.push_back({{"policy", policy.name()}, {"peak_fast", other.peak_fast}, {"peak_slow", other.peak_slow}});
  }
  json["candidates"] = candidates;
  std::fprintf(stderr, "%s\n", plan.describe().c_str());
  if (world.size() > 1) {
    json["rank_plans"] = nlohmann::json::array({json["fast"]});
    for (int rank = 1; rank < world.size(); ++rank) {
      const MemoryPlan other = memory_plan_of(o, config, s, train_tokens, world.size(), rank);
      json["rank_plans"].push_back(other.to_json()["fast"]);
      std::fprintf(stderr, "%s\n", other.describe().c_str());
    }
  }
  std::printf("%s\n", json.dump(2).c_str());
}

// Refuses a run whose planned peak (the step's, start-up's or a whole checkpoint's save, whichever is
// largest), times the ranks sharing this machine (OpenMPI's local size), exceeds the memory
// available, before anything large is allocated. Each rank's plan counts its shards, so FSDP runs
// that fit sharded start.
void require_fits_machine(const MemoryPlan& plan, const ModelConfig& config) {
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int64_t local_ranks = local_size != nullptr ? std::max(1, std::atoi(local_size)) : 1;
  const auto part = [](const char* name, int64_t bytes) { return str_cat(name, " ", human_bytes(double(bytes))); };
  const std::string shards = plan.ranks > 1 ? " (the rank's shards)" : "";
  const int64_t largest = plan.largest();
  std::string where, instead;
  if (largest == plan.checkpoint_save && plan.checkpoint_save > plan.peak_fast) {
    where = str_cat(" at a checkpoint's save (", part("the whole parameters and both moments gathered on every rank",
                                                      plan.checkpoint_save), ")");
    instead = "--sharded-checkpoints, ";
  } else if (largest == plan.start_up && plan.start_up > plan.peak_fast) {
    where = str_cat(" at start-up (", part("the whole parameters before sharding", plan.start_up), shards, ")");
  } else {
    where = str_cat(" at its peak (", plan.peak_at, ", ", plan.policy.name(), ": ", part("parameters", plan.parameters),
                    ", ", part("gradients", plan.gradients), ", ", part("optimizer state", plan.optimizer_state), shards,
                    plan.ranks > 1 ? str_cat(", ", part("gathered units", plan.gathered_at_peak)) : "", ", ",
                    part("buffers", plan.model_buffers), ", ", part("activations", plan.activations_at_peak), ", ",
                    part("workspace", plan.workspace_at_peak), ")");
  }
  require_memory(largest * local_ranks,
                 str_cat("training ", config.source, local_ranks > 1 ? str_cat(" on ", local_ranks, " local ranks") : ""),
                 str_cat(where, local_ranks > 1 ? " per rank" : ""),
                 str_cat(instead, "a smaller model, --batch or --seq-len, or less memory through --recompute, --swap or "
                                  "--memory-budget"));
}

}  // namespace trillion
