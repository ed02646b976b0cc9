// Placeholder registration for `trillion eval` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_eval(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("eval", "not built yet");
  cmd->callback([] { fail("trillion eval: not built yet"); });
}

}  // namespace trillion
