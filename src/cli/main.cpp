// `trillion`: the command-line entry point. Subcommands live in src/cli/*.cpp (commands.h);
// bad input surfaces here as one "error: ..." line and exit status 1, and so does a CPU that lacks
// an instruction set the build uses. Under mpirun every rank runs this; an error on one rank is
// printed with its rank and ends all of them (ProcessGroup::abort_all), never a hang.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/openmp_wait.h"
#include "io/crash_points.h"
#include "ops/gemm.h"
#include "parallel/process_group.h"

namespace {

// One "error: ..." line and exit status 1; under MPI every rank ends.
int report_error(const char* message) {
  const trillion::ProcessGroup& world = trillion::ProcessGroup::world();
  if (world.uses_mpi()) world.abort_all(message, 1);
  std::fprintf(stderr, "error: %s\n", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  trillion::ensure_openmp_wait_policy(argv);
  const std::vector<std::string> missing = trillion::missing_cpu_features();
  if (!missing.empty()) {
    std::string names;
    for (const std::string& name : missing) names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr,
                 "error: this build of trillion uses %s, which this CPU lacks; the default build "
                 "(-DTRILLION_NATIVE=OFF) needs AVX2 and FMA only (any x86-64-v3 machine)\n",
                 names.c_str());
    return 1;
  }
  trillion::ProcessGroup::world();  // joins MPI's world when launched by mpirun
  CLI::App app{"trillion: train and fine-tune sparse MoE language models with hybrid attention"};
  app.require_subcommand(1);
  app.fallthrough();  // every command takes the options below too
  app.add_option_function<std::string>(
         "--gemm", [](const std::string& name) { trillion::set_gemm_backend(trillion::gemm_backend_from_name(name, "--gemm")); },
         "Library of the float matrix products: onednn (the default) or openblas (ops/gemm.h)")
      ->envname("TRILLION_GEMM");
  trillion::register_tokenize(app);
  trillion::register_train(app);
  trillion::register_eval(app);
  trillion::register_generate(app);
  trillion::register_gradcheck(app);
  trillion::register_bench(app);
  trillion::register_info(app);
  trillion::register_plan(app);
  trillion::register_export(app);
  try {
    trillion::install_crash_points_from_environment();  // a test mode (io/crash_points.h); off unless set
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // --help, or a bad flag (the same on every rank)
    trillion::finalize_processes();
    return code;
  } catch (const std::exception& e) {
    // A trillion::Error, or anything else that escapes a command (a std::filesystem_error names
    // the operation and the paths, std::bad_alloc says memory ran out).
    return report_error(e.what());
  }
  trillion::finalize_processes();
  return 0;
}
