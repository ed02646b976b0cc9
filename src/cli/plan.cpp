// `trillion plan --config FILE --devices N [--ep E] [--micro-batch B] [--seq-len T] [--grad-accum G]
// [--precision fp32|bf16] [--recompute …] [--swap …] [--imbalance X] [--sharded-checkpoints]
// [--device-memory BYTES] [LoRA flags] [--json]`: what every device of an N-device mesh holds, by
// part, at its training step's peak, at start-up and at a whole checkpoint's save, before any
// machine is rented. It is the memory plan that training checks at start-up and `train --dry-run`
// prints (train/memory_plan.h), given the mesh's shape instead of mpirun's: FSDP over all N
// devices, the routed experts over groups of E. Nothing is allocated, so a 2.8 T config plans on a
// laptop. (docs/scale.md uses it.)
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "model/config.h"
#include "model/lora_config.h"
#include "parallel/mesh.h"
#include "train/memory_plan.h"

namespace trillion {
namespace {

struct PlanOptions {
  std::string config_path;
  int devices = 1, ep = 1;
  int64_t micro_batch = 1, seq_len = 4096, grad_accum = 1;
  std::string precision = "fp32";
  std::string recompute = "none", swap = "none";
  double imbalance = 1.25;
  bool sharded_checkpoints = false;
  std::string device_memory;
  bool json = false;
};

// The step's shape on device `rank`: its rows of a micro-batch, the run's precision and policy
// inputs, as a training run on that mesh would give them (train/run_setup.cpp, step_memory_shape).
StepMemoryShape shape_of(const PlanOptions& o, int rank) {
  StepMemoryShape shape;
  shape.ranks = o.devices;
  shape.rank = rank;
  shape.ep = o.ep;
  shape.expert_imbalance = o.imbalance;
  shape.grad_accum = o.grad_accum;
  shape.batch = o.micro_batch;
  shape.seq = o.seq_len;
  shape.bf16_products = o.precision == "bf16";
  shape.threads = num_threads();
  shape.whole_checkpoints = !o.sharded_checkpoints;
  return shape;
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return text;
}

// The largest of what the device must hold at once: the step's peak, start-up, a checkpoint's save.
int64_t largest_of(const MemoryPlan& plan) { return std::max({plan.peak_fast, plan.start_up, plan.checkpoint_save}); }

void run_plan(const PlanOptions& o, const LoraOptions& lora) {
  ModelConfig config = ModelConfig::load(o.config_path);
  if (std::optional<LoraConfig> adapter = lora.config())
    config.lora = std::make_shared<const LoraConfig>(std::move(*adapter));
  ParallelMesh::validate(o.devices, o.ep, config);
  const MemoryPolicy policy{o.recompute, o.swap};
  std::vector<MemoryPlan> plans;  // one per device
  for (int rank = 0; rank < o.devices; ++rank) plans.push_back(plan_memory(config, shape_of(o, rank), policy));
  const MemoryPlan& busiest = *std::max_element(plans.begin(), plans.end(), [](const MemoryPlan& a, const MemoryPlan& b) {
    return largest_of(a) < largest_of(b);
  });
  const int64_t capacity = o.device_memory.empty() ? 0 : parse_bytes(o.device_memory, "--device-memory");
  if (o.json) {
    nlohmann::json out = {{"config", o.config_path},     {"devices", o.devices},       {"ep", o.ep},
                          {"micro_batch", o.micro_batch}, {"seq_len", o.seq_len},       {"grad_accum", o.grad_accum},
                          {"precision", o.precision},     {"imbalance", o.imbalance},   {"busiest", busiest.to_json()},
                          {"device_plans", nlohmann::json::array()}};
    for (const MemoryPlan& plan : plans) out["device_plans"].push_back(plan.to_json()["fast"]);  // as --dry-run's rank_plans
    if (capacity > 0) out["fits"] = largest_of(busiest) <= capacity;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("%s on %d device%s (FSDP over all, experts over groups of %d), micro-batch %lld x %lld tokens per "
              "device, %lld micro-batch%s a step, %s\n",
              o.config_path.c_str(), o.devices, o.devices > 1 ? "s" : "", o.ep, static_cast<long long>(o.micro_batch),
              static_cast<long long>(o.seq_len), static_cast<long long>(o.grad_accum), o.grad_accum > 1 ? "es" : "",
              o.precision.c_str());
  std::printf("%s\n", busiest.describe().c_str());
  std::printf("the device that holds the most: rank %d, %s (the step's peak, start-up or a checkpoint's save)\n",
              busiest.rank, gib(largest_of(busiest)).c_str());
  if (capacity > 0)
    std::printf("--device-memory %s: %s\n", o.device_memory.c_str(), largest_of(busiest) <= capacity ? "fits" : "does not fit");
}

}  // namespace

void register_plan(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("plan", "What each device of a mesh holds for a training step, from the "
                                             "memory plan training checks, without allocating");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--config", o->config_path, "Model config.json")->required();
  cmd->add_option("--devices", o->devices, "Devices (ranks): FSDP shards over all of them")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--ep", o->ep, "Expert-parallel degree: the routed experts split over groups of this many devices")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "Sequences per device per micro-batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "Tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--grad-accum", o->grad_accum, "Micro-batches per optimizer step")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32, or bf16 (products' operands and FSDP's gathers in bfloat16)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  cmd->add_option("--recompute", o->recompute, "As train's --recompute")->capture_default_str();
  cmd->add_option("--swap", o->swap, "As train's --swap")->capture_default_str();
  cmd->add_option("--imbalance", o->imbalance,
                  "Rows a device's experts receive per MoE layer, as a multiple of its own routed rows (max/mean load)")
      ->check(CLI::Range(1.0, 1e6))->capture_default_str();
  cmd->add_flag("--sharded-checkpoints", o->sharded_checkpoints,
                "Checkpoints written as shards (a whole checkpoint's save gathers everything on every device)");
  cmd->add_option("--device-memory", o->device_memory, "A device's memory (\"64G\"): say whether the plan fits");
  cmd->add_flag("--json", o->json, "One JSON object instead of text");
  auto lora = std::make_shared<LoraOptions>();
  add_lora_options(cmd, *lora, "Plan");
  cmd->callback([cmd, o, lora] {
    check_lora_options(cmd, *lora);
    run_plan(*o, *lora);
  });
}

}  // namespace trillion
