// `trillion train`: flags of the training run (docs/architecture.md, "Commands and their outputs"); the loop is in train/trainer.h.
#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include "cli/commands.h"
#include "core/error.h"
#include "train/settings.h"
#include "train/trainer.h"

namespace trillion {

// The settings table's flags (train/settings.h), all or those named in `only`.
void add_setting_options(CLI::App* cmd, TrainSettings& s, const std::set<std::string>& only) {
  size_t named = 0;
  for (const Setting& setting : training_settings()) {
    if (!only.empty() && only.count(setting.flag) == 0) continue;
    ++named;
    const std::string flag = std::string("--") + setting.flag;
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), bool TrainSettings::*>) {
            cmd->add_flag(flag, s.*member, setting.help);
          } else {
            CLI::Option* option = cmd->add_option(flag, s.*member, setting.help);
            if (!setting.choices.empty()) option->check(CLI::IsMember(setting.choices));
            if (setting.non_negative) option->check(CLI::NonNegativeNumber);
          }
        },
        setting.member);
  }
  TRILLION_CHECK(only.empty() || named == only.size(), "add_setting_options: a name of `only` is no training setting");
}

void add_step_plan_options(CLI::App* cmd, TrainOptions& o) {
  cmd->add_option("--recompute", o.recompute,
                  "Saved activations recomputed before their layer's backward: none, selective (the FFN "
                  "sublayer), full (the whole layer) or a comma-separated list of activation tags "
                  "(expert_gate_up,expert_act or ep_gate_up,ep_act: formed again inside the experts' "
                  "backward, with no re-run)");
  cmd->add_option("--swap", o.swap,
                  "Saved activations swapped to a file during forward and prefetched during backward: none, "
                  "selective (GEMM and attention outputs), full or a comma-separated list of activation tags");
  cmd->add_flag("--swap-bf16", o.swap_bf16,
                "Store swapped float32 tensors as bfloat16: half the disk traffic, lossy (off by default)");
  cmd->add_option("--ep", o.ep,
                  "Expert-parallel degree: the routed experts split over groups of EP ranks (divides the ranks)");
  cmd->add_option("--cp", o.cp,
                  "Context-parallel degree: each sequence split over groups of CP ranks, which share their rows of "
                  "the batch (divides the ranks / --ep)");
  cmd->add_option("--ep-chunks", o.ep_chunks,
                  "Under mpirun with --ep: token chunks per MoE layer whose exchange overlaps the others' experts");
  cmd->add_option("--expert-imbalance", o.expert_imbalance,
                  "With --ep: the memory plan's rows received by a rank's experts per MoE layer, as a multiple of "
                  "its own routed rows (the start-up check's and --dry-run's margin for uneven routing; default 1.25)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--sharded-checkpoints", o.sharded_checkpoints,
                "Each rank writes its shard of the checkpoint (no gather); `trillion export` converts");
  cmd->add_option("--memory-budget", o.memory_budget,
                  "Fast-tier budget (e.g. 2G): the cheapest recompute / swap policy whose planned peak fits, or "
                  "an error naming the smallest budget it could meet");
  cmd->add_option("--policy-min-bytes", o.policy_min_bytes,
                  "Saved tensors smaller than this are always kept (default 65536)")
      ->check(CLI::PositiveNumber);
}

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model (or resume / fine-tune one) on tokenized data");
  auto options = std::make_shared<TrainOptions>();
  TrainOptions& o = *options;
  TrainSettings& s = o.settings;
  cmd->add_option("--config", o.config_path, "Model config.json (optional with --resume / --init)");
  cmd->add_option("--data", o.data_dir,
                  "Directory written by `trillion tokenize`, or a weighted mixture DIR:W,DIR:W (optional with --resume)");
  cmd->add_option("--out", o.out_dir, "Output directory: metrics.jsonl, checkpoint-*/, latest");
  CLI::Option* resume = cmd->add_option("--resume", o.resume_dir, "Continue a run: its --out directory or a checkpoint");
  CLI::Option* init = cmd->add_option("--init", o.init_dir, "Start a new run from these model weights");
  resume->excludes(init);
  // Settings that define the run (train/settings.h); on --resume they come from trainer_state.json.
  add_setting_options(cmd, s);
  // Settings of this process only.
  add_step_plan_options(cmd, o);
  cmd->add_option("--swap-dir", o.swap_dir, "Directory of the swap file, on local disk (default: --out)");
  cmd->add_option("--collective-timeout", o.collective_timeout_s,
                  "Under mpirun: seconds a collective may wait before the job ends, naming the silent ranks");
  cmd->add_flag("--dry-run", o.dry_run, "Print the memory plan of a step (JSON on stdout) and train nothing");
  cmd->add_option("--stop-after", o.stop_after, "End this process after step K, with a checkpoint");
  cmd->add_option("--save-every", o.save_every, "Checkpoint every K steps (0: only at the end)");
  cmd->add_option("--keep-last", o.keep_last,
                  "Keep only the newest N checkpoints (0: all); older ones are removed once a newer one is complete")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--eval-every", o.eval_every, "Validation loss every K steps (0: off)");
  cmd->add_option("--eval-batches", o.eval_batches, "Batches of validation windows per evaluation");
  cmd->add_option("--log-every", o.log_every, "Progress line every K steps");
  cmd->add_option("--mfu-gemm-size", o.mfu_gemm_size, "Size N of the N³ sgemm whose rate is the MFU ceiling");
  cmd->add_option("--on-nonfinite", o.on_nonfinite,
                  "A step whose loss or gradient is not finite: stop (error naming the step and the first "
                  "non-finite gradient; nothing saved) or skip (drop its update, count it, go on)")
      ->check(CLI::IsMember({"stop", "skip"}));
  cmd->add_option("--max-nonfinite-skips", o.max_nonfinite_skips,
                  "With --on-nonfinite skip: more non-finite steps in a row than this end the run")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--check-numerics", o.check_numerics,
                "Check every sublayer's output in each forward and name the first non-finite one (slower)");
  add_lora_options(cmd, o.lora, "Train");
  cmd->callback([cmd, options] {
    TrainOptions& run = *options;
    check_lora_options(cmd, run.lora);
    for (const Setting& setting : training_settings())
      if (cmd->count(std::string("--") + setting.flag) > 0) run.given.insert(setting.flag);
    if (run.given.count("warmup") == 0 && run.resume_dir.empty()) run.settings.warmup = run.settings.steps / 20;
    run_training(run);
  });
}

void add_lora_options(CLI::App* cmd, LoraOptions& o, const char* verb) {
  const std::string v = verb;
  cmd->add_option("--lora-rank", o.rank, v + " a LoRA adapter of this rank on the frozen model (PEFT's r)");
  cmd->add_option("--lora-alpha", o.alpha, "With --lora-rank: PEFT's lora_alpha (scaling alpha / rank; default 8)");
  cmd->add_option("--lora-targets", o.targets,
                  "With --lora-rank: the adapted linear layers, Hugging Face module names comma-separated "
                  "(q_proj,v_proj) or all-linear (the default)");
  cmd->add_option("--lora-target-parameters", o.target_parameters,
                  "With --lora-rank: the routed experts' stacked weights adapted one pair per expert, comma-separated "
                  "(gate_up_proj,down_proj), as PEFT's target_parameters");
  cmd->add_option("--lora-config", o.config_path,
                  v + " a LoRA adapter as this PEFT adapter_config.json describes (regular expressions, "
                      "rank_pattern, alpha_pattern, modules_to_save, rsLoRA)");
  cmd->add_option("--adapter", o.adapter_dir,
                  v + " the adapter in this PEFT adapter directory (training: its weights, trained further)");
}

void check_lora_options(const CLI::App* cmd, const LoraOptions& o) {
  if (o.rank == 0 && (cmd->count("--lora-alpha") > 0 || cmd->count("--lora-targets") > 0 ||
                      cmd->count("--lora-target-parameters") > 0))
    fail("--lora-alpha / --lora-targets / --lora-target-parameters: expected --lora-rank R with them");
}

}  // namespace trillion
