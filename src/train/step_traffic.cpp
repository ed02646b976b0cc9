// A step's traffic, FLOPs and roofline time per device. See step_traffic.h.
#include "train/step_traffic.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "model/decoder_layer.h"
#include "model/model.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/shard_layout.h"

namespace trillion {
namespace {

int moe_layers_of(const ModelConfig& config) {
  int layers = 0;
  for (int l = 0; l < config.num_hidden_layers; ++l) layers += config.is_moe_layer(l) ? 1 : 0;
  return layers;
}

// Whether a run's per-rank loads are this step's: every layer routes each of the ranks' tokens to k
// experts (dropless), so its rows sum to ranks · tokens · k.
bool loads_fit(const std::vector<std::vector<std::vector<double>>>& loads, double rows) {
  for (const std::vector<std::vector<double>>& layer : loads) {
    double sum = 0.0;
    for (const std::vector<double>& rank : layer)
      for (double x : rank) sum += x;
    if (sum != rows) return false;
  }
  return true;
}

// The mean weight of ep slice p's experts in one layer: the rows its ranks receive over their own.
double slice_weight(const std::vector<double>& layer, int ep, int p) {
  const size_t local = layer.size() / ep;
  double sum = 0.0;
  for (size_t e = p * local; e < (p + 1) * local; ++e) sum += layer[e];
  return sum / double(local);
}

// What `rank` receives from its context-parallel group in one micro-batch's forward and backward:
// each layer's mixer's exchange.
ContextTraffic context_micro_batch_traffic(const ModelConfig& config, StepMemoryShape shape, int rank) {
  shape.rank = rank;
  const LayerStep step(shape);
  ContextTraffic total;
  for (int l = 0; l < config.num_hidden_layers; ++l)
    total += DecoderLayerDims::from_config(config, l).context_traffic(step.shape());
  return total;
}

}  // namespace

Routing imbalanced_routing(const ModelConfig& config, int ep, double imbalance) {
  const int64_t E = config.num_experts;
  if (ep > 1 && (imbalance < 1.0 || imbalance > ep))
    fail("--expert-imbalance ", imbalance, ": expected a value from 1 to the ep degree ", ep,
         " (the busiest ep slice's rows over the mean)");
  std::vector<double> layer(E, 1.0);
  if (ep > 1)
    for (int64_t e = 0; e < E; ++e) layer[e] = e < E / ep ? imbalance : (ep - imbalance) / double(ep - 1);
  Routing routing;
  routing.weights.assign(moe_layers_of(config), layer);
  return routing;
}

Routing measured_routing(const std::string& metrics_path, const ModelConfig& config) {
  std::ifstream in(metrics_path);
  if (!in) fail(metrics_path, ": cannot open the metrics file (--imbalance-from)");
  std::optional<nlohmann::json> last;
  int64_t last_line = 0, line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(metrics_path, ":", line_number, ": not a JSON record (", e.what(), ")");
    }
    if (record.contains("moe_layers")) {
      last = std::move(record);
      last_line = line_number;
    }
  }
  if (!last) fail(metrics_path, ": no step record with \"moe_layers\" (a run of an MoE model's metrics.jsonl)");
  const nlohmann::json& layers = last->at("moe_layers");
  const int expected_layers = moe_layers_of(config);
  if (static_cast<int>(layers.size()) != expected_layers)
    fail(metrics_path, ":", last_line, ": \"moe_layers\" has ", layers.size(), " layers; expected ", expected_layers,
         ", the MoE layers of ", config.source);
  Routing routing;
  for (const nlohmann::json& layer : layers) {
    const nlohmann::json& loads = layer.at("tokens_per_expert");
    if (static_cast<int64_t>(loads.size()) != config.num_experts)
      fail(metrics_path, ":", last_line, ": \"tokens_per_expert\" of layer ", layer.at("layer").get<int>(), " has ",
           loads.size(), " experts; expected ", config.num_experts, ", the routed experts of ", config.source);
    double total = 0.0;
    for (const nlohmann::json& load : loads) total += load.get<double>();
    if (total <= 0.0) fail(metrics_path, ":", last_line, ": layer ", layer.at("layer").get<int>(), " routed no tokens");
    std::vector<double> w;
    for (const nlohmann::json& load : loads) w.push_back(load.get<double>() * double(loads.size()) / total);
    routing.weights.push_back(std::move(w));
  }
  if (last->contains("expert_parallel")) {  // [layers][ranks][E], the layers' experts checked above
    const nlohmann::json& exchange = last->at("expert_parallel");
    routing.rank_loads = exchange.at("rank_tokens_per_expert").get<std::vector<std::vector<std::vector<double>>>>();
    routing.ep = exchange.at("ep").get<int>();
    routing.ranks = routing.rank_loads.empty() ? 0 : static_cast<int>(routing.rank_loads[0].size());
  }
  return routing;
}

double received_imbalance(const Routing& routing, int ep) {
  double worst = 1.0;
  for (const std::vector<double>& layer : routing.weights)
    for (int p = 0; p < ep; ++p) worst = std::max(worst, slice_weight(layer, ep, p));
  return worst;
}

nlohmann::json DeviceTraffic::to_json() const {
  nlohmann::json out = {{"rank", rank},
                        {"fsdp_gathered_bytes", fsdp_gathered},
                        {"fsdp_reduce_scattered_bytes", fsdp_reduce_scattered},
                        {"expert_dispatched_bytes", expert_dispatched},
                        {"expert_combined_bytes", expert_combined},
                        {"context_gathered_bytes", context_gathered},
                        {"context_reduced_bytes", context_reduced},
                        {"flops", flops},
                        {"expert_flops", expert_flops},
                        {"rerun_flops", rerun_flops},
                        {"context_flops", context_flops},
                        {"expert_rows", expert_rows},
                        {"swap_bytes", swap_bytes}};
  if (step_s > 0.0)
    out["seconds"] = {{"compute", compute_s},
                      {"fsdp", fsdp_s},
                      {"swap", swap_s},
                      {"exchange", exchange_s},
                      {"exposed_exchange", exposed_exchange_s},
                      {"context", context_s},
                      {"step", step_s}};
  return out;
}

std::vector<DeviceTraffic> plan_step_traffic(const ModelConfig& config, const StepMemoryShape& shape,
                                             const Routing& routing) {
  const ParamTable table = param_table_of(config);
  const int ranks = shape.ranks, ep = shape.ep;
  const int64_t e = shape.element_bytes, G = shape.grad_accum, k = config.num_experts_per_tok;
  const double tokens = double(shape.batch * shape.seq * G) / shape.cp;  // the device's, per step (a cp group's mean)
  const TrainingFlops flops = training_flops_of(config, table, shape.seq);

  // Each rank's routed rows per layer and expert: the run's own for its mesh and step shape, else
  // the weights' expected rows, every rank alike (then one ep group stands for all).
  const bool own_loads =
      routing.has_loads_of(ranks, ep) && loads_fit(routing.rank_loads, double(ranks) * tokens * double(k));
  const int modelled = own_loads ? ranks : ep;
  std::vector<std::vector<std::vector<double>>> loads;  // [layers][modelled][E]
  if (own_loads) {
    loads = routing.rank_loads;
  } else {
    const double per_expert = tokens * double(k) / double(std::max<int64_t>(1, config.num_experts));
    for (const std::vector<double>& layer : routing.weights) {
      std::vector<double> rows(layer.size());
      for (size_t x = 0; x < layer.size(); ++x) rows[x] = per_expert * layer[x];
      loads.emplace_back(modelled, rows);
    }
  }
  std::vector<ExchangeBytes> exchange(modelled);  // none without MoE layers
  if (!loads.empty()) exchange = exchange_bytes(loads, ep, config.hidden_size, e);
  // The rows each rank's experts run, summed over the layers: its ep slice's rows from its group.
  std::vector<double> expert_rows(modelled, 0.0);
  for (const std::vector<std::vector<double>>& layer : loads) {
    for (int r = 0; r < modelled; ++r) {
      const size_t local = layer[r].size() / ep;
      for (size_t x = 0; x < layer[r].size(); ++x) expert_rows[(r / ep) * ep + int(x / local)] += layer[r][x];
    }
  }
  double context_flops_per_token = 0.0;
  for (int l = 0; l < config.num_hidden_layers; ++l)
    context_flops_per_token += DecoderLayerDims::from_config(config, l).context_flops_per_token(shape.seq);
  // A routed row's FLOPs (model.h's routed share of a token, over its k rows in each MoE layer).
  const double per_row = loads.empty() ? 0.0 : flops.routed_experts / double(k * loads.size());

  std::vector<DeviceTraffic> devices(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    DeviceTraffic& d = devices[rank];
    d.rank = rank;
    d.tokens = tokens;
    if (ranks > 1) {
      const ShardLayout layout(table, rank, ranks, ep);
      d.fsdp_gathered = 2 * G * layout.gather_bytes(table, shape.bf16_gathers(), e);
      d.fsdp_reduce_scattered = layout.reduce_scatter_bytes(e);
    }
    d.expert_dispatched = exchange[rank % modelled].dispatched;
    d.expert_combined = exchange[rank % modelled].combined;
    d.expert_rows = expert_rows[rank % modelled];
    d.expert_flops = d.expert_rows * per_row;
    d.flops = tokens * (flops.per_token - flops.routed_experts) + d.expert_flops;
    if (shape.cp > 1) {
      const ContextTraffic context = context_micro_batch_traffic(config, shape, rank);
      d.context_gathered = G * context.gathered_bytes;
      d.context_reduced = G * context.reduced_bytes;
      d.context_flops = tokens * context_flops_per_token;
      d.flops += d.context_flops;
    }
  }
  return devices;
}

std::vector<DeviceTraffic> time_step(std::vector<DeviceTraffic> devices, const StepMemoryShape& shape,
                                     const MemoryPlan& memory, const DeviceRates& rates) {
  const int ranks = shape.ranks, ep = shape.ep;
  // The links the collectives cross: FSDP's groups span the mesh; an ep group is ep consecutive ranks.
  const double fsdp_bandwidth = ranks <= rates.node_size ? rates.intra_bandwidth : rates.inter_bandwidth;
  const double off_node = ep > rates.node_size ? double(ep - rates.node_size) / double(ep - 1) : 0.0;
  const double context_bandwidth = ep * shape.cp <= rates.node_size ? rates.intra_bandwidth : rates.inter_bandwidth;
  for (DeviceTraffic& d : devices) {
    d.rerun_flops = d.tokens * memory.rerun_flops_per_token + d.expert_rows * memory.rebuild_flops_per_routed_row;
    d.flops += d.rerun_flops;
    d.swap_bytes = 2 * memory.peak_slow * shape.grad_accum;  // written in the forward, read in the backward
    const double sent = d.expert_dispatched + d.expert_combined;
    const bool timed = rates.flops > 0.0 && (ranks == 1 || fsdp_bandwidth > 0.0) &&
                       (ep == 1 || (rates.intra_bandwidth > 0.0 && (off_node == 0.0 || rates.inter_bandwidth > 0.0))) &&
                       (d.swap_bytes == 0 || rates.host_bandwidth > 0.0) && (shape.cp == 1 || context_bandwidth > 0.0);
    if (!timed) continue;
    d.compute_s = d.flops / rates.flops;
    d.fsdp_s = ranks > 1 ? double(d.fsdp_gathered + d.fsdp_reduce_scattered) / fsdp_bandwidth : 0.0;
    d.swap_s = d.swap_bytes > 0 ? double(d.swap_bytes) / rates.host_bandwidth : 0.0;
    if (ep > 1) {
      d.exchange_s = std::max(sent * (1.0 - off_node) / rates.intra_bandwidth,
                              off_node > 0.0 ? sent * off_node / rates.inter_bandwidth : 0.0);
    }
    const int chunks = std::max(1, rates.exchange_chunks);
    d.exposed_exchange_s = chunks == 1 ? d.exchange_s
                                       : std::max(d.exchange_s / chunks, d.exchange_s - d.expert_flops / rates.flops);
    d.context_s = shape.cp > 1 ? double(d.context_gathered + d.context_reduced) / context_bandwidth : 0.0;
    d.step_s = std::max({d.compute_s, d.fsdp_s, d.swap_s}) + d.exposed_exchange_s + d.context_s;
  }
  return devices;
}

double parse_rate(const std::string& text, const char* option) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string suffix(end);
  static const std::vector<std::pair<std::string, double>> scales = {
      {"", 1.0}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}};
  for (const auto& [name, scale] : scales)
    if (suffix == name && end != text.c_str() && std::isfinite(value) && value > 0.0) return value * scale;
  fail(option, " ", text, ": expected a positive rate, a number with an optional K, M, G, T or P (powers of 1000)");
}

}  // namespace trillion
