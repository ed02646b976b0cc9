// The `trillion` subcommands. Each register_* adds its subcommand with its flags and a callback
// to the app; callbacks throw trillion::Error on bad input, which main() reports.
#pragma once

#include <CLI/CLI.hpp>

namespace trillion {

struct LoraOptions;

void register_tokenize(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_generate(CLI::App& app);
void register_gradcheck(CLI::App& app);
void register_bench(CLI::App& app);
void register_info(CLI::App& app);
void register_plan(CLI::App& app);
void register_export(CLI::App& app);

// The LoRA flags train and info share (--lora-rank, --lora-alpha, --lora-targets,
// --lora-target-parameters, --lora-config, --adapter), their help led by `verb` ("Train"), and the
// check that the rank's companions come with it.
void add_lora_options(CLI::App* cmd, LoraOptions& o, const char* verb);
void check_lora_options(const CLI::App* cmd, const LoraOptions& o);

}  // namespace trillion
