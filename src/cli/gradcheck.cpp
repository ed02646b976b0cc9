// `trillion gradcheck`: the whole model in double against central finite differences
// (model/gradient_check.h). Prints one line per tensor, then as its last line a JSON object
// {"max_rel_err", "worst_tensor", "checked", "refined_at_kinks", "skipped_at_kinks", "tolerance"};
// exits 0 only when something was checked, every tensor has a numeric gradient above its noise
// floor and every tensor is within tolerance beyond that floor (elements whose step still crosses
// a kink at an eighth of it are counted, not compared). Under mpirun it first
// checks the distributed step's gradient (FSDP, --ep) against one process's on the same batch
// (parallel/distributed_gradient_check.h; every rank takes part, rank 0 reports and then runs the
// finite differences); the JSON line adds "distributed_max_rel_err" and its tolerance.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "model/gradient_check.h"
#include "parallel/distributed_gradient_check.h"
#include "parallel/process_group.h"

namespace trillion {

namespace {

struct GradcheckArgs {
  std::string config_path;
  GradientCheckOptions options;
  int ep = 1;
  int cp = 1;
  double distributed_tolerance = 1e-12;
  int64_t lora_rank = 0;  // > 0: LoRA adapters on the targets (lora_targets), or as lora_config says
  std::string lora_targets = "all-linear";
  std::string lora_target_parameters;
  std::string lora_config;
};

void print_check(const TensorCheck& t, double tolerance) {
  std::printf("%-48s checked %7lld  refined %4lld  skipped %4lld  max_abs_err %.3e  floor %.3e  max_ref %.3e  "
              "rel_err %.3e  %s\n",
              t.name.c_str(), static_cast<long long>(t.checked), static_cast<long long>(t.refined),
              static_cast<long long>(t.skipped), t.max_abs_err,
              t.noise_floor, t.max_ref, t.rel_err,
              t.vacuous() ? "FAIL (no numeric gradient above its noise floor)" : t.rel_err <= tolerance ? "ok" : "FAIL");
}

void run_gradcheck(const GradcheckArgs& args) {
  ModelConfig config = ModelConfig::load(args.config_path);
  if (args.lora_rank > 0 && !args.lora_config.empty()) fail("--lora-rank and --lora-config are exclusive");
  if (args.lora_rank > 0 || !args.lora_config.empty()) {
    config.lora = std::make_shared<const LoraConfig>(
        args.lora_config.empty() ? LoraConfig::from_flags(args.lora_rank, 8.0, args.lora_targets,
                                                                        args.lora_target_parameters)
                                 : LoraConfig::load(args.lora_config));
  }
  const ProcessGroup& world = ProcessGroup::world();
  if (args.cp > 1 && world.size() == 1) fail("--cp ", args.cp, " needs mpirun with a multiple of ", args.cp, " ranks");
  nlohmann::json summary;
  if (world.size() > 1) {
    const std::vector<TensorCheck> distributed =
        check_distributed_gradients(config, args.options, world, args.ep, args.cp);
    if (!world.is_root()) return;
    std::printf("distributed gradient of %s on %s, ep %d, cp %d, against one process's:\n", args.config_path.c_str(),
                world.describe().c_str(), args.ep, args.cp);
    double worst = 0.0;
    for (const TensorCheck& t : distributed) {
      print_check(t, args.distributed_tolerance);
      worst = std::max(worst, t.rel_err);
    }
    summary["distributed_max_rel_err"] = worst;
    summary["distributed_tolerance"] = args.distributed_tolerance;
  }
  const GradientCheckReport report = check_model_gradients(config, args.options);
  std::printf("gradient check of %s: batch %lld, seq %lld, %s\n", args.config_path.c_str(),
              static_cast<long long>(args.options.batch), static_cast<long long>(args.options.seq),
              report.full ? "every element" : "random directions per tensor");
  const double tolerance = args.options.tolerance;
  for (const TensorCheck& t : report.tensors) print_check(t, tolerance);
  summary["max_rel_err"] = report.max_rel_err;
  summary["worst_tensor"] = report.worst_tensor;
  summary["checked"] = report.checked;
  summary["refined_at_kinks"] = report.refined;
  summary["skipped_at_kinks"] = report.skipped;
  summary["tolerance"] = tolerance;
  std::printf("%s\n", summary.dump().c_str());
  std::fflush(stdout);
  if (report.checked == 0) fail("gradient check failed: nothing was checked");
  for (const TensorCheck& t : report.tensors)
    if (t.vacuous())
      fail("gradient check failed: no numeric gradient of ", t.name, " rose above its noise floor (", t.noise_floor,
           ") outside a kink, so it was not checked");
  if (!report.passed(tolerance))
    fail("gradient check failed: max_rel_err ", report.max_rel_err, " in ", report.worst_tensor, " exceeds tolerance ",
         tolerance);
  if (summary.contains("distributed_max_rel_err") &&
      !(summary["distributed_max_rel_err"].get<double>() <= args.distributed_tolerance))
    fail("gradient check failed: the distributed gradient differs from one process's by ",
         summary["distributed_max_rel_err"].get<double>(), ", over tolerance ", args.distributed_tolerance);
}

}  // namespace

void register_gradcheck(CLI::App& app) {
  auto args = std::make_shared<GradcheckArgs>();
  CLI::App* cmd = app.add_subcommand("gradcheck", "Check the model's gradients against finite differences (double)");
  cmd->add_option("--config", args->config_path, "Model config.json")->required();
  cmd->add_option("--seq-len", args->options.seq, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--batch", args->options.batch, "Sequences")->capture_default_str();
  cmd->add_option("--seed", args->options.seed, "Seed of weights, tokens and directions")->capture_default_str();
  cmd->add_option("--tolerance", args->options.tolerance,
                  "Largest relative error per tensor beyond the differences' noise floor")
      ->capture_default_str();
  cmd->add_option("--directions", args->options.directions,
                  "Random directions per tensor when the model is too large to check every element")
      ->capture_default_str();
  cmd->add_option("--max-elements", args->options.max_full_elements,
                  "Check every element when the model has at most this many parameters")
      ->capture_default_str();
  cmd->add_option("--ep", args->ep, "Under mpirun: expert-parallel degree of the distributed check")
      ->capture_default_str();
  cmd->add_option("--cp", args->cp,
                  "Under mpirun: context-parallel degree of the distributed check (each sequence split over cp ranks)")
      ->capture_default_str();
  cmd->add_option("--distributed-tolerance", args->distributed_tolerance,
                  "Under mpirun: largest relative difference per tensor between the distributed and one process's gradient")
      ->capture_default_str();
  cmd->add_option("--lora-rank", args->lora_rank,
                  "Check a LoRA model: adapters of this rank on --lora-targets, B drawn non-zero, the base frozen");
  cmd->add_option("--lora-targets", args->lora_targets, "With --lora-rank: module names comma-separated, or all-linear");
  cmd->add_option("--lora-target-parameters", args->lora_target_parameters,
                  "With --lora-rank: routed experts' stacked weights comma-separated (gate_up_proj,down_proj)");
  cmd->add_option("--lora-config", args->lora_config, "Check a LoRA model as this PEFT adapter_config.json describes");
  cmd->add_option("--step", args->options.step, "Finite-difference step (relative to max(1, |θ|))")
      ->capture_default_str();
  auto mode = std::make_shared<std::string>("sparse");
  cmd->add_option("--indexer-mode", *mode, "Sparse attention layers: dense, warmup (both: dense attention) or sparse")
      ->check(CLI::IsMember({"dense", "warmup", "sparse"}))
      ->capture_default_str();
  cmd->add_option("--indexer-loss-coef", args->options.indexer_loss_coef,
                  "Indexer loss coefficient (its tensors are checked against it, the others without it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--document-eos", args->options.document_eos,
                  "Document masks: this token ends a document (the batch holds it at about every fourth position)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([cmd, args, mode] {
    if (args->lora_rank == 0 && (cmd->count("--lora-targets") > 0 || cmd->count("--lora-target-parameters") > 0))
      fail("--lora-targets / --lora-target-parameters: expected --lora-rank R with them");
    args->options.indexer_mode = indexer_mode_from_name(*mode);
    run_gradcheck(*args);
  });
}

}  // namespace trillion
