// A training run's set-up before its first step: the settings checked, the config, data, weights
// and trainer state resolved for a fresh, --init or --resume run (what a resumed run may change and
// what it must keep), the output directory created, and the memory plan of every rank's step that
// the run is checked against before anything large is allocated.
#pragma once

#include <memory>
#include <string>

#include "data/mixture.h"
#include "model/config.h"
#include "ops/gemm.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace trillion {

struct RunSetup {
  ModelConfig config;
  DataMixture data;
  std::string weights_dir;  // checkpoint or weights to load; empty: seeded initialization
  std::string adapter_dir;  // a LoRA adapter to load after them (--adapter, a resumed run's); empty: none
  bool resumed = false;
  TrainerState state;       // settings and, when resumed, the saved progress
};

// Fails with the flag named when a setting is out of range (or does not fit the ranks and --cp).
void validate_settings(const TrainSettings& s, int cp);
// The matmul precision of `eval` and `generate`: `given` (their --precision), else the run's
// (`saved`: its trainer_state.json's settings, null without one: fp32). bf16 with a float64
// checkpoint fails naming both.
MatmulPrecision checkpoint_matmul_precision(const std::string& given, const TrainSettings* saved);

// A new run's LoRA config from its --lora-rank / --lora-config / --adapter (null: none), refusing
// what is not built (dropout, mpirun, --moe-bias-rate, names PEFT reads otherwise on MoE models).
std::shared_ptr<const LoraConfig> new_run_lora(const TrainOptions& o, const ModelConfig& config);
// --expert-layout `name` for a run of `config`: refused without LoRA, or naming the tensor or field
// when the adapter cannot be written in that layout (check_adapter_layout), before any step.
void check_expert_layout(const std::string& name, const ModelConfig& config);

// Resolves config, data, weights and settings for a fresh, --init or --resume run.
RunSetup prepare_run(TrainOptions& o);

// The step's shape for the memory plan and the traffic plan (train/step_traffic.h) of `rank` of
// `ranks` (every rank's differs a little: the shards' sizes, the expert slices; s.batch is the
// global batch); train_tokens: the training split's size (0 before the data is known: a dry run).
StepMemoryShape step_memory_shape(const TrainOptions& o, const TrainSettings& s, int64_t train_tokens, int ranks,
                                  int rank);
// The memory plan of `rank`'s step of `ranks` (train/memory_plan.h; s.batch is the global batch)
// with the run's policy: --recompute / --swap as given, or, with --memory-budget and neither given,
// the cheapest candidate that fits; a given policy over the budget is an error. train_tokens: the
// training split's size (0: not known). Training and `trillion plan` both plan through it; `table`:
// the config's parameter table when built already (else built here).
MemoryPlan memory_plan_of(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                          int64_t train_tokens, int ranks, int rank, const ParamTable* table = nullptr);
// --dry-run: the plan (JSON on stdout, lines on stderr), every candidate's peak, and under mpirun
// every rank's plan; rank 0 prints.
void print_memory_plan(const TrainOptions& o, const ModelConfig& config, const TrainSettings& s,
                       int64_t train_tokens);
// Refuses a run whose planned peak (the step's or start-up's), times the ranks on this machine,
// exceeds the memory available, before anything large is allocated.
void require_fits_machine(const MemoryPlan& plan, const ModelConfig& config);

}  // namespace trillion
