// `trillion plan --config FILE --devices N [--micro-batch B] [--threads T] [--device-memory BYTES]
// [--host-memory BYTES] [--device-flops F --intra-bandwidth B --inter-bandwidth B --node-size D]
// [--imbalance-from metrics.jsonl] [--search] [--json] [train's flags that shape the plan]`: what
// every device of an N-device mesh holds, by part, at its training step's peak, at start-up and at a
// whole checkpoint's save, what it sends and computes per step, and the step time of a stated
// roofline (train/step_traffic.h), before any machine is rented. The memory is the plan training
// checks at start-up and `train --dry-run` prints under mpirun: the same function
// (train/run_setup.h, memory_plan_of) with train's own flags (--seq-len, --grad-accum, --precision,
// --indexer-mode, --recompute, --swap, --ep, --cp, --ep-chunks, --expert-imbalance, the LoRA flags, …),
// given the mesh's size instead of mpirun's; the bytes sent are those training's counters count.
// --search plans every ep dividing the devices and the experts with every policy --memory-budget
// tries, and lists them by step time (those a missing rate leaves untimed last), then by the step's
// peak; --longest-sequence finds the longest sequence whose step fits --device-memory. Nothing is allocated, so a 2.8 T
// config plans on a laptop (docs/scale.md).
#include <omp.h>

#include <algorithm>
#include <cmath>
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
#include "model/model.h"
#include "parallel/mesh.h"
#include "train/run_setup.h"
#include "train/step_traffic.h"

namespace trillion {
namespace {

struct PlanOptions {
  TrainOptions train;  // the run's flags, as train takes them
  int devices = 1;
  int64_t micro_batch = 1;
  int threads = 0;  // 0: this process's OpenMP threads
  std::string device_memory, host_memory;
  std::string device_flops, intra_bandwidth, inter_bandwidth, host_bandwidth;  // rates ("989T", "450G")
  int node_size = 8;
  std::string imbalance_from;  // a run's metrics.jsonl: its last step's expert loads
  bool search = false;
  bool longest_sequence = false;
  bool json = false;
};

// The device with the largest value of `key` (the first of equals).
template <class T, class Key>
const T& largest_by(const std::vector<T>& items, Key key) {
  return *std::max_element(items.begin(), items.end(), [&](const T& a, const T& b) { return key(a) < key(b); });
}

double exchanged(const DeviceTraffic& d) { return d.expert_dispatched + d.expert_combined; }

void print_traffic(const PlanOptions& o, const std::vector<DeviceTraffic>& traffic, double imbalance) {
  const TrainOptions& t = o.train;
  const DeviceTraffic& fsdp = largest_by(traffic, [](const DeviceTraffic& d) { return d.fsdp_gathered + d.fsdp_reduce_scattered; });
  std::printf("per step a device's FSDP gathers move %s and its reduce-scatters %s (rank %d, the most)",
              human_bytes(double(fsdp.fsdp_gathered)).c_str(), human_bytes(double(fsdp.fsdp_reduce_scattered)).c_str(),
              fsdp.rank);
  if (t.ep > 1) {
    double mean = 0.0;
    for (const DeviceTraffic& d : traffic) mean += exchanged(d) / double(traffic.size());
    const DeviceTraffic& busiest = largest_by(traffic, exchanged);
    std::printf("; its expert exchange sends %s on the mean device, %s on the busiest (rank %d, its experts receiving "
                "%.3g x the mean rows%s)",
                human_bytes(mean).c_str(), human_bytes(exchanged(busiest)).c_str(), busiest.rank, imbalance,
                o.imbalance_from.empty() ? "" : str_cat(", as measured in ", o.imbalance_from).c_str());
  }
  if (t.cp > 1) {
    const DeviceTraffic& context =
        largest_by(traffic, [](const DeviceTraffic& d) { return d.context_gathered + d.context_reduced; });
    std::printf("; from its context-parallel group it receives %s gathered and %s of gradient sums (rank %d, the most)",
                human_bytes(double(context.context_gathered)).c_str(),
                human_bytes(double(context.context_reduced)).c_str(), context.rank);
  }
  const DeviceTraffic& most = largest_by(traffic, [](const DeviceTraffic& d) { return d.flops; });
  std::printf(
      "\nFLOPs per step: %.4g on the busiest device (rank %d), %.4g of them its experts', %.4g recompute's, "
      "%.4g context parallelism's\n",
      most.flops, most.rank, most.expert_flops, most.rerun_flops, most.context_flops);
  const DeviceTraffic& slowest = largest_by(traffic, [](const DeviceTraffic& d) { return d.step_s; });
  if (slowest.step_s <= 0.0) {
    std::printf("step time: give --device-flops and the rates it needs (--intra-bandwidth; --inter-bandwidth beyond "
                "--node-size %d devices; --host-bandwidth with --swap)\n", o.node_size);
    return;
  }
  std::printf(
      "step time (roofline): %.4g s = max(compute %.4g s, FSDP %.4g s, swap %.4g s) + exchange %.4g s of %.4g "
      "s not hidden + context %.4g s, on rank %d; %.0f tokens/s over the mesh\n",
      slowest.step_s, slowest.compute_s, slowest.fsdp_s, slowest.swap_s, slowest.exposed_exchange_s, slowest.exchange_s,
      slowest.context_s, slowest.rank,
      double(t.settings.batch * t.settings.seq_len * t.settings.grad_accum) / slowest.step_s);
}

// Whether `plan` fits a device of `capacity` bytes, and where it does not.
std::string verdict(const MemoryPlan& plan, int64_t capacity) {
  if (plan.largest() <= capacity) return "fits";
  if (plan.largest() == plan.start_up)
    return str_cat("does not fit at start-up (", human_bytes(double(plan.start_up)),
                   ": every device holds the whole parameters before it takes its shard)");
  if (plan.largest() == plan.checkpoint_save)
    return str_cat("does not fit at a whole checkpoint's save (", human_bytes(double(plan.checkpoint_save)),
                   "; --sharded-checkpoints saves the shards)");
  return str_cat("does not fit at the step's peak (", human_bytes(double(plan.peak_fast)), ", ", plan.peak_at, ")");
}

// A device too small for its weights alone is a bad input, named in one line.
void require_weights_fit(const std::vector<MemoryPlan>& plans, const std::string& text, int64_t capacity) {
  const MemoryPlan& most = largest_by(plans, [](const MemoryPlan& p) { return p.parameters; });
  if (most.parameters > capacity)
    fail("--device-memory ", text, ": too small for the weights alone: device ", most.rank, "'s parameters",
         plans.size() > 1 ? " (its shards and the buffers every device keeps)" : "", " take ",
         human_bytes(double(most.parameters)));
}

// The routing the plan assumes for `ep` (t.expert_imbalance follows measured loads).
Routing routing_for(const PlanOptions& o, TrainOptions& t, const ModelConfig& config, int ep) {
  if (o.imbalance_from.empty()) return imbalanced_routing(config, ep, t.expert_imbalance);
  Routing routing = measured_routing(o.imbalance_from, config);
  t.expert_imbalance = received_imbalance(routing, ep);
  return routing;
}

DeviceRates rates_of(const PlanOptions& o) {
  DeviceRates rates;
  if (!o.device_flops.empty()) rates.flops = parse_rate(o.device_flops, "--device-flops");
  if (!o.intra_bandwidth.empty()) rates.intra_bandwidth = parse_rate(o.intra_bandwidth, "--intra-bandwidth");
  if (!o.inter_bandwidth.empty()) rates.inter_bandwidth = parse_rate(o.inter_bandwidth, "--inter-bandwidth");
  if (!o.host_bandwidth.empty()) rates.host_bandwidth = parse_rate(o.host_bandwidth, "--host-bandwidth");
  rates.node_size = o.node_size;
  rates.exchange_chunks = o.train.ep_chunks;
  return rates;
}

double slowest_step(const std::vector<DeviceTraffic>& traffic) {
  return largest_by(traffic, [](const DeviceTraffic& d) { return d.step_s; }).step_s;
}

// --search: each ep that divides the devices and the routed experts, with each policy
// --memory-budget tries; rank 0's memory plan stands for every device's (the ranks' shards differ by
// at most one element per range), the step time is the slowest device's.
void run_search(PlanOptions& o, const ModelConfig& config, const ParamTable& table) {
  TrainOptions& t = o.train;
  if (t.recompute != "none" || t.swap != "none" || !t.memory_budget.empty())
    fail("--search tries every policy --memory-budget tries: leave --recompute, --swap and --memory-budget out");
  const int64_t capacity = o.device_memory.empty() ? 0 : parse_bytes(o.device_memory, "--device-memory");
  struct Candidate {
    int ep;
    MemoryPolicy policy;
    int64_t largest, peak;
    double step_s;
  };
  std::vector<Candidate> candidates;
  const double margin = t.expert_imbalance;
  for (int ep = 1; ep <= o.devices; ++ep) {
    if (o.devices % ep != 0 || (o.devices / ep) % t.cp != 0 ||
        (ep > 1 && (config.num_experts == 0 || config.num_experts % ep != 0)))
      continue;
    t.ep = ep;
    t.expert_imbalance = std::min(margin, double(ep));  // no slice receives more than every row
    const Routing routing = routing_for(o, t, config, ep);
    const StepMemoryShape shape = step_memory_shape(t, t.settings, 0, o.devices, 0);
    const std::vector<DeviceTraffic> traffic = plan_step_traffic(config, shape, routing);
    for (const MemoryPolicy& policy : budget_candidates()) {
      const MemoryPlan plan = plan_memory(config, table, shape, policy);
      if (capacity > 0 && plan.largest() > capacity) continue;
      if (shape.cp > 1 && plan.reruns_mixers) continue;  // not under cp yet
      const double step_s = slowest_step(time_step(traffic, shape, plan, rates_of(o)));
      candidates.push_back({ep, policy, plan.largest(), plan.peak_fast, step_s});
    }
  }
  // Timed ones first, by step time; then those a missing rate leaves untimed; each by its step's peak.
  const auto time_of = [](const Candidate& c) { return c.step_s > 0.0 ? c.step_s : HUGE_VAL; };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    return time_of(a) != time_of(b) ? time_of(a) < time_of(b) : a.peak < b.peak;
  });
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Candidate& c : candidates)
      out.push_back({{"ep", c.ep}, {"policy", c.policy.name()}, {"largest", c.largest}, {"peak_fast", c.peak},
                     {"step_s", c.step_s}});
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("%zu meshes and policies%s, by the roofline's step time, then the step's peak (untimed: a rate it "
              "needs is missing):\n",
              candidates.size(), capacity > 0 ? str_cat(" that fit --device-memory ", o.device_memory).c_str() : "");
  for (const Candidate& c : candidates)
    std::printf("  ep %4d  %-34s step peak %10s  largest %10s  %s\n", c.ep, c.policy.name().c_str(),
                human_bytes(double(c.peak)).c_str(), human_bytes(double(c.largest)).c_str(),
                c.step_s > 0.0 ? str_cat("step ", c.step_s, " s").c_str() : "untimed");
}

// --longest-sequence: the longest --seq-len whose step's peak fits --device-memory on every device
// (start-up and a whole checkpoint's save do not depend on it; the plan below says whether they
// fit). The search plans a few ranks, one per place in a cp group at first (their chunks differ by
// a token); every device is planned at its answer, and a device that holds more joins them and the
// search goes on below it (FSDP's shards of some units differ between ranks).
int64_t longest_sequence(PlanOptions& o, const ModelConfig& config, const ParamTable& table) {
  TrainOptions& t = o.train;
  if (o.device_memory.empty()) fail("--longest-sequence: expected --device-memory, the peak it must fit");
  if (o.search) fail("--longest-sequence plans one mesh and policy: leave --search out");
  const int64_t capacity = parse_bytes(o.device_memory, "--device-memory");
  const auto step_peak = [&](int64_t seq, int rank) {
    t.settings.seq_len = seq;
    return memory_plan_of(t, config, t.settings, /*train_tokens=*/0, o.devices, rank, &table).peak_fast;
  };
  std::vector<int> watched;  // the ranks the search plans
  for (int place = 0; place < t.cp; ++place) watched.push_back(place * t.ep);
  const auto watched_fit = [&](int64_t seq) {
    return std::all_of(watched.begin(), watched.end(), [&](int rank) { return step_peak(seq, rank) <= capacity; });
  };
  const int64_t shortest = 2 * t.cp;                   // every rank of a cp group at least a token of each chunk
  int64_t fails = config.max_position_embeddings + 1;  // the answer < fails
  while (true) {
    if (fails <= shortest || !watched_fit(shortest))
      fail("--longest-sequence: --device-memory ", o.device_memory, " does not hold the step's peak even at ", shortest,
           " tokens per sequence");
    int64_t fits = shortest, tried = 2 * shortest;  // fits ≤ the answer
    for (; tried < fails && watched_fit(tried); tried *= 2) fits = tried;
    fails = std::min(fails, tried);
    while (fails - fits > 1) {
      const int64_t middle = fits + (fails - fits) / 2;
      (watched_fit(middle) ? fits : fails) = middle;
    }
    int busiest = 0;
    int64_t most = 0;
    for (int rank = 0; rank < o.devices; ++rank)
      if (const int64_t peak = step_peak(fits, rank); peak > most) busiest = rank, most = peak;
    if (most <= capacity) return fits;
    watched.push_back(busiest);
    fails = fits;
  }
}

void run_plan(PlanOptions& o) {
  TrainOptions& t = o.train;
  if (o.threads > 0) omp_set_num_threads(o.threads);  // per-thread workspaces scale with it
  ModelConfig config = ModelConfig::load(t.config_path);
  config.lora = new_run_lora(t, config);
  check_expert_layout(t.settings.expert_layout, config);
  ParallelMesh::validate(o.devices, t.ep, config, t.cp);
  t.settings.batch = o.micro_batch * (o.devices / t.cp);  // the global batch, as train's --batch
  const ParamTable table = param_table_of(config);
  if (o.longest_sequence) t.settings.seq_len = longest_sequence(o, config, table);
  if (o.search) return run_search(o, config, table);
  const Routing routing = routing_for(o, t, config, t.ep);
  const ParamCounts counts = count_parameters(config, table);
  std::vector<MemoryPlan> plans;  // one per device
  for (int rank = 0; rank < o.devices; ++rank)
    plans.push_back(memory_plan_of(t, config, t.settings, /*train_tokens=*/0, o.devices, rank, &table));
  const StepMemoryShape shape = step_memory_shape(t, t.settings, 0, o.devices, 0);
  const std::vector<DeviceTraffic> traffic =
      time_step(plan_step_traffic(config, shape, routing), shape, plans[0], rates_of(o));
  const MemoryPlan& busiest = largest_by(plans, [](const MemoryPlan& p) { return p.largest(); });
  const int64_t swap_per_node = largest_by(plans, [](const MemoryPlan& p) { return p.peak_slow; }).peak_slow *
                                std::min(o.node_size, o.devices);
  const int64_t capacity = o.device_memory.empty() ? 0 : parse_bytes(o.device_memory, "--device-memory");
  if (capacity > 0) require_weights_fit(plans, o.device_memory, capacity);
  const int64_t host = o.host_memory.empty() ? 0 : parse_bytes(o.host_memory, "--host-memory");
  if (o.json) {
    nlohmann::json out = {{"config", t.config_path},
                          {"devices", o.devices},
                          {"ep", t.ep},
                          {"cp", t.cp},
                          {"micro_batch", o.micro_batch},
                          {"seq_len", t.settings.seq_len},
                          {"grad_accum", t.settings.grad_accum},
                          {"precision", t.settings.precision},
                          {"expert_imbalance", t.expert_imbalance},
                          {"threads", num_threads()},
                          {"busiest", busiest.to_json()},
                          {"total_parameters", counts.total},
                          {"active_parameters", counts.active},
                          {"swap_bytes_per_node", swap_per_node},
                          {"device_plans", nlohmann::json::array()},
                          {"device_traffic", nlohmann::json::array()}};
    for (const MemoryPlan& plan : plans) out["device_plans"].push_back(plan.to_json()["fast"]);  // as --dry-run's rank_plans
    for (const DeviceTraffic& d : traffic) out["device_traffic"].push_back(d.to_json());
    if (capacity > 0) out["fits"] = busiest.largest() <= capacity;
    if (o.longest_sequence) out["longest_sequence"] = t.settings.seq_len;
    if (host > 0) out["swap_fits_host"] = swap_per_node <= host;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf(
      "%s (%.4g B parameters, %.4g B active per token) on %d device%s (FSDP over all, experts over groups of "
      "%d%s), micro-batch %lld x %lld tokens per device%s, %lld micro-batch%s a step, %s, %d threads per "
      "device\n",
      t.config_path.c_str(), double(counts.total) / 1e9, double(counts.active) / 1e9, o.devices,
      o.devices > 1 ? "s" : "", t.ep, t.cp > 1 ? str_cat(", sequences over groups of ", t.cp).c_str() : "",
      static_cast<long long>(o.micro_batch), static_cast<long long>(t.settings.seq_len),
      t.cp > 1 ? str_cat(" (its cp group's, split)").c_str() : "", static_cast<long long>(t.settings.grad_accum),
      t.settings.grad_accum > 1 ? "es" : "", t.settings.precision.c_str(), num_threads());
  if (o.longest_sequence)
    std::printf("the longest sequence whose step fits --device-memory %s: %lld tokens%s%s\n", o.device_memory.c_str(),
                static_cast<long long>(t.settings.seq_len),
                t.cp > 1 ? str_cat(", about ", t.settings.seq_len / t.cp, " per device").c_str() : "",
                t.settings.seq_len == config.max_position_embeddings
                    ? " (the config's max_position_embeddings: the memory would hold longer)"
                    : "");
  std::printf("%s\n", busiest.describe().c_str());
  std::printf("the device that holds the most: rank %d, %s (the step's peak, start-up or a checkpoint's save)\n",
              busiest.rank, human_bytes(double(busiest.largest())).c_str());
  if (capacity > 0)
    std::printf("--device-memory %s: %s\n", o.device_memory.c_str(), verdict(busiest, capacity).c_str());
  if (swap_per_node > 0)
    std::printf("swap files on a node's host (%d devices): %s%s\n", std::min(o.node_size, o.devices),
                human_bytes(double(swap_per_node)).c_str(),
                host > 0 ? str_cat("; --host-memory ", o.host_memory, swap_per_node <= host ? ": fits" : ": does not fit").c_str() : "");
  print_traffic(o, traffic, t.expert_imbalance);
}

}  // namespace

void register_plan(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("plan", "What each device of a mesh holds for a training step, from the "
                                             "memory plan training checks, without allocating");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--config", o->train.config_path, "Model config.json")->required();
  cmd->add_option("--devices", o->devices, "Devices (ranks): FSDP shards over all of them")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch,
                  "Sequences per device per micro-batch (with --cp: per context-parallel group, each sequence split "
                  "over its devices)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "OpenMP threads per device (per-thread workspaces; default: this machine's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device-memory", o->device_memory, "A device's memory (\"64G\"): say whether the plan fits");
  cmd->add_option("--host-memory", o->host_memory,
                  "A node's host memory (\"1T\"): say whether its devices' swap files fit (--swap)");
  cmd->add_option("--device-flops", o->device_flops,
                  "FLOP/s a device sustains in the run's precision (\"400T\"): the roofline's step time");
  cmd->add_option("--intra-bandwidth", o->intra_bandwidth, "Bytes/s a device sends within its node (\"450G\")");
  cmd->add_option("--inter-bandwidth", o->inter_bandwidth, "Bytes/s a device sends to other nodes (\"50G\")");
  cmd->add_option("--host-bandwidth", o->host_bandwidth,
                  "Bytes/s between a device and its host's memory (\"50G\"): swap's transfers (--swap)");
  cmd->add_option("--node-size", o->node_size, "Devices per node")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--imbalance-from", o->imbalance_from,
                  "A run's metrics.jsonl: its last step's expert loads set the rows each ep slice receives "
                  "(instead of --expert-imbalance)");
  cmd->add_flag("--search", o->search,
                "Every ep dividing the devices and experts with every memory policy (that fits --device-memory), "
                "by step time");
  cmd->add_flag("--longest-sequence", o->longest_sequence,
                "The longest --seq-len whose step's peak fits --device-memory on every device (with --cp: the "
                "whole sequence, split), then the plan at that length");
  cmd->add_flag("--json", o->json, "One JSON object, with every device's plan and traffic, instead of text");
  add_setting_options(cmd, o->train.settings,
                      {"seq-len", "grad-accum", "dtype", "precision", "indexer-mode", "indexer-loss-coef",
                       "loss-gradients", "expert-layout"});
  add_step_plan_options(cmd, o->train);
  add_lora_options(cmd, o->train.lora, "Plan");
  cmd->callback([cmd, o] {
    check_lora_options(cmd, o->train.lora);
    run_plan(*o);
  });
}

}  // namespace trillion
