// Placeholder registration for `trillion tokenize` until its implementation lands.
#include "cli/commands.h"
#include "core/error.h"

namespace trillion {

void register_tokenize(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenize", "not built yet");
  cmd->callback([] { fail("trillion tokenize: not built yet"); });
}

}  // namespace trillion
