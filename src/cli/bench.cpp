// Placeholder registration for `trillion bench` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "not built yet");
  cmd->callback([] { fail("trillion bench: not built yet"); });
}

}  // namespace trillion
