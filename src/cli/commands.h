// The `trillion` subcommands. Each register_* adds its subcommand with its flags and a callback
// to the app; callbacks throw trillion::Error on bad input, which main() reports.
#pragma once

#include <CLI/CLI.hpp>

namespace trillion {

void register_tokenize(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_generate(CLI::App& app);
void register_gradcheck(CLI::App& app);
void register_bench(CLI::App& app);
void register_info(CLI::App& app);
void register_export(CLI::App& app);

}  // namespace trillion
