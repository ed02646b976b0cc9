// The `trillion` subcommands. Each register_* adds its subcommand with its flags and a callback
// to the app; callbacks throw trillion::Error on bad input, which main() reports.
#pragma once

#include <set>
#include <string>

#include <CLI/CLI.hpp>

namespace trillion {

struct LoraOptions;
struct TrainOptions;
struct TrainSettings;

void register_tokenize(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_generate(CLI::App& app);
void register_gradcheck(CLI::App& app);
void register_bench(CLI::App& app);
void register_info(CLI::App& app);
void register_plan(CLI::App& app);
void register_export(CLI::App& app);
// `trillion bench`'s subcommands run under mpirun (cli/bench_parallel.cpp).
void add_parallel_benches(CLI::App* bench);

// The LoRA flags train and info share (--lora-rank, --lora-alpha, --lora-targets,
// --lora-target-parameters, --lora-config, --adapter), their help led by `verb` ("Train"), and the
// check that the rank's companions come with it.
void add_lora_options(CLI::App* cmd, LoraOptions& o, const char* verb);
void check_lora_options(const CLI::App* cmd, const LoraOptions& o);
// train's flags that `trillion plan` takes too, declared once (cli/train.cpp): the settings table's
// flags (train/settings.h), all or those named in `only`; and the process's options that shape the
// memory plan and the step's traffic (--recompute, --swap, --swap-bf16, --ep, --ep-chunks,
// --expert-imbalance, --sharded-checkpoints, --memory-budget, --policy-min-bytes).
void add_setting_options(CLI::App* cmd, TrainSettings& s, const std::set<std::string>& only = {});
void add_step_plan_options(CLI::App* cmd, TrainOptions& o);

}  // namespace trillion
