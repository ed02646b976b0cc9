// What one training step sends and computes on each device of a mesh, from shapes alone, and the
// step time a stated roofline gives them (docs/architecture.md, "The plan"): `trillion plan`'s
// communication, FLOPs and step time beside the memory plan (train/memory_plan.h).
//
// Bytes are those the engine's own counters count and metrics.jsonl reports, by the same functions:
//   - FSDP (metrics' "fsdp"): each unit gathered twice per micro-batch, its gradients reduce-
//     scattered once per step: 2 · G · ShardLayout::gather_bytes + ShardLayout::reduce_scatter_bytes,
//     exactly what the rank's counters count;
//   - the expert exchange (metrics' "expert_parallel"): parallel/expert_parallel.h's exchange_bytes
//     of the step's routing loads. A plan has no routing, so it takes every rank's rows of a layer as
//     spread over the experts by weights of mean 1 (`Routing`): uniform, the busiest ep slice
//     receiving `expert_imbalance` times the mean (the memory plan's margin), or a run's measured
//     loads (--imbalance-from); the bytes are then the expected ones (dropless routing), or, for
//     the run's own mesh, its ranks' loads as they were: its bytes exactly;
//   - context parallelism (metrics' "context_parallel"): what each rank receives from its cp group,
//     per micro-batch each sequence mixer's (DecoderLayerDims::context_traffic: attention's keys and
//     values, MLA's latents, gathered in the forward and again in the backward, with the other
//     ranks' terms of their gradients; the indexer's keys and their loss's gradients; the delta
//     rule's summaries and the convolution's halos), exactly what its counters count.
// FLOPs: the model FLOPs of the device's tokens (model.h's training_flops_of), its experts' share
// scaled by the rows they receive; under context parallelism what the split mixers compute beyond
// one rank's (DecoderLayerDims::context_flops_per_token: MLA's absorbed attention, the delta rule's
// second run and its forming again); and recompute's: the forward of the sublayers it re-runs per
// token, and the gate/up products the experts' backward forms again per row its experts run (the
// memory plan's rerun_flops_per_token and rebuild_flops_per_routed_row). Swap: each swapped tensor written to the host
// in the forward and read back in the backward (the memory plan's swap-file bytes, twice per micro-batch).
//
// The roofline, per device: compute at --device-flops; FSDP's gathers and reduce-scatters at the
// link their group crosses (intra-node when the mesh fits one node, else inter-node) and swap at
// --host-bandwidth, both overlapped with compute (prefetch); the exchange at its links (an ep group
// is ep consecutive ranks, taken as aligned to nodes: with ep above the node size the rows for the
// ep − node size ranks off the node at the inter-node rate, the rest intra-node), not overlapped
// with one chunk, and with C > 1 chunks all but max(1/C of it, what the device's expert compute
// cannot hide) hidden; context parallelism's gathers and reduce-scatters, which the layers wait for,
// at the link its group crosses (its ranks are ep apart):
//   step = max(compute, FSDP, swap) + exposed exchange + context. The step time is the slowest device's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "train/memory_plan.h"

namespace trillion {

// How each MoE layer's routed rows spread over its experts: weights [moe layers][E] of mean 1 per
// layer, every rank routing alike; and a run's own loads per rank when it had them (metrics'
// "expert_parallel"), which the plan of the same mesh (ranks, ep) and step shape (its tokens per
// rank and step) takes as they are: then its exchange bytes are the run's, exactly.
struct Routing {
  std::vector<std::vector<double>> weights;
  std::vector<std::vector<std::vector<double>>> rank_loads;  // [moe layers][ranks][E]; empty: none
  int ranks = 0, ep = 0;                                     // the mesh of rank_loads
  bool has_loads_of(int mesh_ranks, int mesh_ep) const {
    return !rank_loads.empty() && ranks == mesh_ranks && ep == mesh_ep;
  }
};
// The busiest ep slice (experts [0, E/ep)) receiving `imbalance` times the mean, the others the
// rest alike (1 ≤ imbalance ≤ ep); uniform with ep 1.
Routing imbalanced_routing(const ModelConfig& config, int ep, double imbalance);
// The last step of a run's metrics.jsonl with MoE loads ("moe_layers"[l]["tokens_per_expert"],
// normalized per layer; and "expert_parallel"'s per-rank loads when present); fails naming the
// file, the line and the field when the run has none, or another number of MoE layers or experts
// than `config`.
Routing measured_routing(const std::string& metrics_path, const ModelConfig& config);
// The rows the busiest ep slice's ranks receive as a multiple of their own (max over layers and
// slices of the slice's mean weight): the memory plan's expert_imbalance for this routing.
double received_imbalance(const Routing& routing, int ep);

// The links and rates of the devices (flags of `trillion plan`); 0: not given.
struct DeviceRates {
  double flops = 0.0;            // FLOP/s a device sustains in the run's precision
  double intra_bandwidth = 0.0;  // bytes/s a device sends to devices of its node
  double inter_bandwidth = 0.0;  // bytes/s a device sends to other nodes
  double host_bandwidth = 0.0;   // bytes/s between a device and its host's memory (swap)
  int node_size = 8;             // devices per node
  int exchange_chunks = 1;       // --ep-chunks
};

struct DeviceTraffic {
  int rank = 0;
  // Per step: bytes FSDP's gathers and reduce-scatters move for this device (the range but its own
  // piece, in or out: a ring's volume), and expected bytes its exchange sends.
  int64_t fsdp_gathered = 0, fsdp_reduce_scattered = 0;
  double expert_dispatched = 0.0, expert_combined = 0.0;
  int64_t context_gathered = 0, context_reduced = 0;      // received from its context-parallel group
  double flops = 0.0, expert_flops = 0.0;                 // per step (expert_flops: of them, its experts')
  double rerun_flops = 0.0;                               // of them, recompute's
  double context_flops = 0.0;                             // of them, context parallelism's own
  double expert_rows = 0.0;                               // rows its experts run, summed over the MoE layers
  int64_t swap_bytes = 0;                                 // to the host and back, per step
  double tokens = 0.0;                                    // the device's, per step
  // The roofline's seconds (0 without the rates they need).
  double compute_s = 0.0, fsdp_s = 0.0, swap_s = 0.0, exchange_s = 0.0, exposed_exchange_s = 0.0, context_s = 0.0,
         step_s = 0.0;
  nlohmann::json to_json() const;
};

// Every device's traffic and model FLOPs for the step of `shape` (any rank's: its ranks, ep, batch,
// grad_accum and precision), whatever the memory policy.
std::vector<DeviceTraffic> plan_step_traffic(const ModelConfig& config, const StepMemoryShape& shape,
                                             const Routing& routing);
// The same under the memory plan `memory` (its policy's re-runs and swap), with the roofline's
// times where `rates` give what they need.
std::vector<DeviceTraffic> time_step(std::vector<DeviceTraffic> devices, const StepMemoryShape& shape,
                                     const MemoryPlan& memory, const DeviceRates& rates);

// "989T", "450G", "1.5e12" (suffixes K, M, G, T, P: powers of 1000); `option` names the flag in errors.
double parse_rate(const std::string& text, const char* option);

}  // namespace trillion
