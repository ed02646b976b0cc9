// `trillion plan --config FILE --devices N [--micro-batch B] [--threads T] [--device-memory BYTES]
// [--json] [train's flags that shape the plan]`: what every device of an N-device mesh holds, by
// part, at its training step's peak, at start-up and at a whole checkpoint's save, before any
// machine is rented. It is the plan training checks at start-up and `train --dry-run` prints under
// mpirun: the same function (train/run_setup.h, memory_plan_of) with train's own flags (--seq-len,
// --grad-accum, --precision, --indexer-mode, --recompute, --swap, --ep, --expert-imbalance, the
// LoRA flags, …), given the mesh's size instead of mpirun's. Nothing is allocated, so a 2.8 T config
// plans on a laptop (docs/scale.md).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/machine_memory.h"
#include "core/parallel.h"
#include "model/config.h"
#include "model/lora_config.h"
#include "parallel/mesh.h"
#include "train/run_setup.h"

namespace trillion {
namespace {

struct PlanOptions {
  TrainOptions train;  // the run's flags, as train takes them
  int devices = 1;
  int64_t micro_batch = 1;
  int threads = 0;  // 0: this process's OpenMP threads
  std::string device_memory;
  bool json = false;
};

void run_plan(PlanOptions& o) {
  TrainOptions& t = o.train;
  if (o.threads > 0) omp_set_num_threads(o.threads);  // per-thread workspaces scale with it
  ModelConfig config = ModelConfig::load(t.config_path);
  config.lora = new_run_lora(t, config);
  check_expert_layout(t.settings.expert_layout, config);
  ParallelMesh::validate(o.devices, t.ep, config);
  t.settings.batch = o.micro_batch * o.devices;  // the global batch, as train's --batch
  std::vector<MemoryPlan> plans;                 // one per device
  for (int rank = 0; rank < o.devices; ++rank)
    plans.push_back(memory_plan_of(t, config, t.settings, /*train_tokens=*/0, o.devices, rank));
  const MemoryPlan& busiest = *std::max_element(plans.begin(), plans.end(), [](const MemoryPlan& a, const MemoryPlan& b) {
    return a.largest() < b.largest();
  });
  const int64_t capacity = o.device_memory.empty() ? 0 : parse_bytes(o.device_memory, "--device-memory");
  if (o.json) {
    nlohmann::json out = {{"config", t.config_path},           {"devices", o.devices},
                          {"ep", t.ep},                        {"micro_batch", o.micro_batch},
                          {"seq_len", t.settings.seq_len},     {"grad_accum", t.settings.grad_accum},
                          {"precision", t.settings.precision}, {"expert_imbalance", t.expert_imbalance},
                          {"threads", num_threads()},          {"busiest", busiest.to_json()},
                          {"device_plans", nlohmann::json::array()}};
    for (const MemoryPlan& plan : plans) out["device_plans"].push_back(plan.to_json()["fast"]);  // as --dry-run's rank_plans
    if (capacity > 0) out["fits"] = busiest.largest() <= capacity;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("%s on %d device%s (FSDP over all, experts over groups of %d), micro-batch %lld x %lld tokens per "
              "device, %lld micro-batch%s a step, %s, %d threads per device\n",
              t.config_path.c_str(), o.devices, o.devices > 1 ? "s" : "", t.ep, static_cast<long long>(o.micro_batch),
              static_cast<long long>(t.settings.seq_len), static_cast<long long>(t.settings.grad_accum),
              t.settings.grad_accum > 1 ? "es" : "", t.settings.precision.c_str(), num_threads());
  std::printf("%s\n", busiest.describe().c_str());
  std::printf("the device that holds the most: rank %d, %s (the step's peak, start-up or a checkpoint's save)\n",
              busiest.rank, human_bytes(double(busiest.largest())).c_str());
  if (capacity > 0)
    std::printf("--device-memory %s: %s\n", o.device_memory.c_str(), busiest.largest() <= capacity ? "fits" : "does not fit");
}

}  // namespace

void register_plan(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("plan", "What each device of a mesh holds for a training step, from the "
                                             "memory plan training checks, without allocating");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--config", o->train.config_path, "Model config.json")->required();
  cmd->add_option("--devices", o->devices, "Devices (ranks): FSDP shards over all of them")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "Sequences per device per micro-batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--threads", o->threads, "OpenMP threads per device (per-thread workspaces; default: this machine's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device-memory", o->device_memory, "A device's memory (\"64G\"): say whether the plan fits");
  cmd->add_flag("--json", o->json, "One JSON object, with every device's plan, instead of text");
  add_setting_options(cmd, o->train.settings,
                      {"seq-len", "grad-accum", "dtype", "precision", "indexer-mode", "indexer-loss-coef",
                       "loss-gradients", "expert-layout"});
  add_memory_plan_options(cmd, o->train);
  add_lora_options(cmd, o->train.lora, "Plan");
  cmd->callback([cmd, o] {
    check_lora_options(cmd, o->train.lora);
    run_plan(*o);
  });
}

}  // namespace trillion
