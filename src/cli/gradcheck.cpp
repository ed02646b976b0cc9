// Placeholder registration for `trillion gradcheck` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_gradcheck(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("gradcheck", "not built yet");
  cmd->callback([] { fail("trillion gradcheck: not built yet"); });
}

}  // namespace trillion
