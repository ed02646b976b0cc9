// Placeholder registration for `trillion train` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "not built yet");
  cmd->callback([] { fail("trillion train: not built yet"); });
}

}  // namespace trillion
