// Placeholder registration for `trillion generate` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "not built yet");
  cmd->callback([] { fail("trillion generate: not built yet"); });
}

}  // namespace trillion
