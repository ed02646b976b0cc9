// The step's traffic plan (train/step_traffic.h) against hand counts on the tiny Qwen3-MoE config
// (hidden 16, 6 experts, top-2, two MoE layers): the exchange's expected bytes under uniform and
// imbalanced routing, the experts' FLOPs following the rows they receive, the model FLOPs the
// trainer's MFU uses, the roofline's terms on one node and across nodes with and without chunks,
// swap's transfers, context parallelism's own FLOPs (on tiny_kimi_k3_like), loads read from a
// run's metrics (and the errors naming file, line and field), and rates as users write them. The
// bytes against a real run's counters: tests/parallel/parallel_memory_plan_test.cpp.
#include "train/step_traffic.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

#include "core/error.h"
#include "model/lora_config.h"
#include "model/model.h"
#include "model/test_configs.h"

namespace trillion {
namespace {

const ModelConfig& moe_config() {
  static const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_qwen3_moe.json"));
  return config;
}

// 4 ranks, 2 sequences of 16 tokens each per micro-batch, float64.
StepMemoryShape shape_of(int ep, int64_t grad_accum = 1) {
  StepMemoryShape shape;
  shape.ranks = 4;
  shape.ep = ep;
  shape.batch = 2;
  shape.seq = 16;
  shape.element_bytes = 8;
  shape.grad_accum = grad_accum;
  return shape;
}

constexpr double kRowBytes = (2 * 16 + 1) * 8;  // a row's two crossings of H doubles and its weight

TEST(StepTraffic, UniformRoutingSendsHalfOfEachRanksRowsAtEpTwo) {
  const ModelConfig& config = moe_config();
  const std::vector<DeviceTraffic> devices =
      plan_step_traffic(config, shape_of(2, 3), imbalanced_routing(config, 2, 1.0));
  ASSERT_EQ(devices.size(), 4u);
  const double rows = 2 * 3 * 2 * 16 * 2;  // layers × micro-batches × tokens × top-k
  for (const DeviceTraffic& d : devices) {
    EXPECT_DOUBLE_EQ(d.expert_dispatched, rows / 2 * kRowBytes) << "rank " << d.rank;
    EXPECT_DOUBLE_EQ(d.expert_combined, rows / 2 * kRowBytes) << "rank " << d.rank;
    EXPECT_GT(d.fsdp_gathered, 0);
    EXPECT_GT(d.fsdp_reduce_scattered, 0);
  }
  const std::vector<DeviceTraffic> one =
      plan_step_traffic(config, shape_of(1), imbalanced_routing(config, 1, 1.25));
  EXPECT_EQ(one[0].expert_dispatched + one[0].expert_combined, 0.0) << "no exchange without ep";
}

// The busiest slice's ranks receive 1.5 × their own rows, the other's 0.5 ×; every rank sends the
// rows for the other slice (a quarter of its own, or three quarters) and sends back what it received.
TEST(StepTraffic, ImbalanceLoadsTheFirstSlicesRanks) {
  const ModelConfig& config = moe_config();
  const Routing routing = imbalanced_routing(config, 2, 1.5);
  EXPECT_DOUBLE_EQ(received_imbalance(routing, 2), 1.5);
  const std::vector<DeviceTraffic> devices = plan_step_traffic(config, shape_of(2), routing);
  const double rows = 2 * 2 * 16 * 2;
  for (const DeviceTraffic& d : devices) {
    const bool busiest = d.rank % 2 == 0;
    EXPECT_DOUBLE_EQ(d.expert_dispatched, rows * (busiest ? 0.25 : 0.75) * kRowBytes) << "rank " << d.rank;
    EXPECT_DOUBLE_EQ(d.expert_combined, rows * (busiest ? 0.75 : 0.25) * kRowBytes) << "rank " << d.rank;
  }
  EXPECT_DOUBLE_EQ(devices[0].expert_flops, 3.0 * devices[1].expert_flops);
  EXPECT_DOUBLE_EQ(devices[0].flops - devices[0].expert_flops, devices[1].flops - devices[1].expert_flops);
  // Over the mesh the FLOPs are the model's, as the trainer's MFU counts them.
  const Model<double> model(config);
  double total = 0.0;
  for (const DeviceTraffic& d : devices) total += d.flops;
  EXPECT_NEAR(total, 4 * 2 * 16 * model.training_flops_per_token(16), 1e-9 * total);
  EXPECT_THROW(imbalanced_routing(config, 2, 2.5), Error) << "more than every row on one slice";
}

// Full recompute re-runs every layer's forward: a third of the layers' training FLOPs more (the LM
// head is not re-run). With ep a re-run MoE sublayer does not exchange: its routed experts' third
// (18 · k · D · I a token and layer) is not re-run, and the owners' backward forms each received
// row's gate/up output again instead (2 · 2I · D a row).
TEST(StepTraffic, RecomputeAddsTheReRunForwards) {
  const ModelConfig& config = moe_config();
  const Model<double> model(config);
  const double D = 16, I = 8, k = 2, head = 6.0 * double(config.vocab_size) * D, tokens = 2 * 16;
  const double routed = 2 * 18 * k * D * I;  // per token, both MoE layers
  for (const int ep : {1, 2}) {
    SCOPED_TRACE(ep);
    StepMemoryShape shape = shape_of(ep);
    shape.policy_min_bytes = 1;  // every saved tensor follows the policy
    const Routing routing = imbalanced_routing(config, ep, 1.0);
    const std::vector<DeviceTraffic> traffic = plan_step_traffic(config, shape, routing);
    const DeviceTraffic kept = time_step(traffic, shape, plan_memory(config, shape, MemoryPolicy{}), DeviceRates{})[0];
    const DeviceTraffic recomputed =
        time_step(traffic, shape, plan_memory(config, shape, MemoryPolicy{"full", "none"}), DeviceRates{})[0];
    EXPECT_EQ(kept.rerun_flops, 0.0);
    EXPECT_DOUBLE_EQ(recomputed.expert_rows, 2 * tokens * k) << "its share of both layers' rows";
    const double expected = ep == 1 ? tokens * (model.training_flops_per_token(16) - head) / 3
                                    : tokens * (model.training_flops_per_token(16) - head - routed) / 3 +
                                          recomputed.expert_rows * 4 * D * I;
    EXPECT_NEAR(recomputed.rerun_flops, expected, 1e-9 * kept.flops);
    EXPECT_DOUBLE_EQ(recomputed.flops, kept.flops + recomputed.rerun_flops);
  }
}

// Under context parallelism each device computes its tokens' share of one rank's FLOPs and what the
// split mixers add (tiny_kimi_k3_like: 3 KDA layers of 2 heads of 4, a sparse MLA layer of 2 heads,
// nope 4, rope 2, v 5, r_kv 6, top-5), counted by hand: the delta rule's kernel, 2 · 64 · (3 K + 2 V)
// + 6 K V forward FLOPs a token and head, runs 4 times (the forward and its forming again in the
// backward, each the forward and backward's 3 of one rank's) on both its values and the transition's
// K values from I, plus the correction's 3 products of K · V; MLA's absorbed form attends per key
// over 2 · 6 + 2 values in place of 4 + 2 + 5, and its queries' absorption and output's expansion
// through W_e [2 · (4 + 5), 6] run twice with both gradients (4 products) where kv_b_proj's expansion
// ran once with its two (3). Gated DeltaNet with K ≠ V (tiny_qwen3_next_hybrid: 2 layers of 4 value
// heads, K 4, V 3). Attention (GQA) adds nothing.
TEST(StepTraffic, ContextParallelismAddsWhatTheSplitMixersCompute) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("tiny_kimi_k3_like.json"));
  StepMemoryShape split = shape_of(1);
  split.cp = 2;
  const std::vector<DeviceTraffic> one = plan_step_traffic(config, shape_of(1), imbalanced_routing(config, 1, 1.0));
  const std::vector<DeviceTraffic> devices = plan_step_traffic(config, split, imbalanced_routing(config, 1, 1.0));
  const double kernel = 2 * 64 * (3 * 4 + 2 * 4) + 6 * 4 * 4;  // K = V = 4
  const double kda = 2 * (4 * (kernel + kernel) + 3 * 2 * 4 * 4 - 3 * kernel);
  const double mla = 3 * 2 * 5 * 2 * ((2 * 6 + 2) - (4 + 2 + 5)) +  // top-5 of the 8 keys a token sees on average
                     2 * (4 - 3) * (2 * (4 + 5)) * 6;
  const double tokens = 2 * 16 / 2;
  for (const DeviceTraffic& d : devices) {
    SCOPED_TRACE(d.rank);
    EXPECT_DOUBLE_EQ(d.tokens, tokens);
    EXPECT_DOUBLE_EQ(d.context_flops, tokens * (3 * kda + mla));
    EXPECT_NEAR(d.flops - d.context_flops, one[d.rank].flops / 2, 1e-12 * d.flops) << "its tokens' share";
    EXPECT_DOUBLE_EQ(d.to_json().at("context_flops").get<double>(), d.context_flops);
  }
  EXPECT_EQ(one[0].context_flops, 0.0);

  // A rank-3 adapter on kv_b_proj freezes the base: the rows widen to L = 6 + 3 and dW_e spans them all,
  // where one rank forms kv_b_proj's products without its gradient and the adapter's B with its two.
  ModelConfig adapted = config;
  adapted.lora = std::make_shared<const LoraConfig>(LoraConfig::from_flags(3, 6, "kv_b_proj"));
  const double mla_adapted = 3 * 2 * 5 * 2 * ((2 * 9 + 2) - (4 + 2 + 5)) + 8 * 18 * 9 - (4 * 18 * 6 + 6 * 18 * 3);
  for (const DeviceTraffic& d : plan_step_traffic(adapted, split, imbalanced_routing(adapted, 1, 1.0)))
    EXPECT_DOUBLE_EQ(d.context_flops, tokens * (3 * kda + mla_adapted)) << "rank " << d.rank;

  const ModelConfig hybrid = ModelConfig::load(testing::model_config_path("tiny_qwen3_next_hybrid.json"));
  const double values_run = 2 * 64 * (3 * 4 + 2 * 3) + 6 * 4 * 3, transition_run = kernel;
  const double gdn = 4 * (4 * (values_run + transition_run) + 3 * 2 * 4 * 3 - 3 * values_run);
  for (const DeviceTraffic& d : plan_step_traffic(hybrid, split, imbalanced_routing(hybrid, 1, 1.0)))
    EXPECT_DOUBLE_EQ(d.context_flops, tokens * 2 * gdn) << "rank " << d.rank;

  StepMemoryShape attention = shape_of(2);
  attention.cp = 2;
  for (const DeviceTraffic& d : plan_step_traffic(moe_config(), attention, imbalanced_routing(moe_config(), 2, 1.0))) {
    EXPECT_GT(d.context_gathered, 0) << "rank " << d.rank;
    EXPECT_EQ(d.context_flops, 0.0) << "rank " << d.rank;
  }
}

TEST(StepTraffic, RooflineTermsFollowTheLinks) {
  const ModelConfig& config = moe_config();
  const StepMemoryShape shape = shape_of(2);
  const std::vector<DeviceTraffic> traffic = plan_step_traffic(config, shape, imbalanced_routing(config, 2, 1.25));
  DeviceRates rates{.flops = 1e9, .intra_bandwidth = 1e6, .inter_bandwidth = 1e5, .host_bandwidth = 0.0,
                    .node_size = 8, .exchange_chunks = 1};
  for (const DeviceTraffic& d : time_step(traffic, shape, MemoryPlan{}, rates)) {
    const double sent = d.expert_dispatched + d.expert_combined;
    EXPECT_DOUBLE_EQ(d.compute_s, d.flops / 1e9);
    EXPECT_DOUBLE_EQ(d.fsdp_s, double(d.fsdp_gathered + d.fsdp_reduce_scattered) / 1e6) << "one node";
    EXPECT_DOUBLE_EQ(d.exchange_s, sent / 1e6);
    EXPECT_DOUBLE_EQ(d.exposed_exchange_s, d.exchange_s) << "one chunk hides nothing";
    EXPECT_DOUBLE_EQ(d.step_s, std::max(d.compute_s, d.fsdp_s) + d.exchange_s);
  }
  rates.node_size = 1;  // every other device on another node
  rates.exchange_chunks = 4;
  for (const DeviceTraffic& d : time_step(traffic, shape, MemoryPlan{}, rates)) {
    const double sent = d.expert_dispatched + d.expert_combined;
    EXPECT_DOUBLE_EQ(d.fsdp_s, double(d.fsdp_gathered + d.fsdp_reduce_scattered) / 1e5);
    EXPECT_DOUBLE_EQ(d.exchange_s, sent / 1e5);
    EXPECT_DOUBLE_EQ(d.exposed_exchange_s, std::max(d.exchange_s / 4, d.exchange_s - d.expert_flops / 1e9));
    EXPECT_DOUBLE_EQ(d.step_s, std::max(d.compute_s, d.fsdp_s) + d.exposed_exchange_s);
  }
  // Swap: the swap file's bytes out and back per micro-batch, at the host link, beside compute.
  MemoryPlan swapping;
  swapping.peak_slow = int64_t{1} << 30;
  EXPECT_EQ(time_step(traffic, shape, swapping, rates)[0].step_s, 0.0) << "no --host-bandwidth";
  rates.host_bandwidth = 1e8;
  const DeviceTraffic d = time_step(traffic, shape, swapping, rates)[0];
  EXPECT_EQ(d.swap_bytes, int64_t{2} << 30);
  EXPECT_DOUBLE_EQ(d.swap_s, double(int64_t{2} << 30) / 1e8);
  EXPECT_DOUBLE_EQ(d.step_s, std::max({d.compute_s, d.fsdp_s, d.swap_s}) + d.exposed_exchange_s);
  rates.inter_bandwidth = 0.0;
  EXPECT_EQ(time_step(traffic, shape, MemoryPlan{}, rates)[0].step_s, 0.0) << "no --inter-bandwidth";
}

// An ep group wider than a node: of ep 4 over nodes of 2, two of each device's three peers are on
// other nodes, so two thirds of its exchanged rows cross the slower link (32 experts: demo_moe).
TEST(StepTraffic, AnEpGroupWiderThanANodeSendsThePeersOffTheNodeAcrossIt) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path("demo_moe.json"));
  StepMemoryShape shape = shape_of(4);
  shape.seq = 32;
  const DeviceRates rates{.flops = 1e12, .intra_bandwidth = 1e8, .inter_bandwidth = 1e7, .host_bandwidth = 0.0,
                          .node_size = 2, .exchange_chunks = 1};
  for (const DeviceTraffic& d :
       time_step(plan_step_traffic(config, shape, imbalanced_routing(config, 4, 1.0)), shape, MemoryPlan{}, rates)) {
    const double sent = d.expert_dispatched + d.expert_combined;
    ASSERT_GT(sent, 0.0);
    EXPECT_DOUBLE_EQ(d.exchange_s, std::max(sent / 3 / 1e8, sent * 2 / 3 / 1e7)) << "rank " << d.rank;
    EXPECT_DOUBLE_EQ(d.fsdp_s, double(d.fsdp_gathered + d.fsdp_reduce_scattered) / 1e7) << "4 devices, 2 nodes";
  }
}

std::string write_metrics(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    measured_routing(path, moe_config());
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(StepTraffic, MeasuredLoadsComeFromTheLastStepWithThem) {
  const std::string path = write_metrics(
      "traffic_metrics.jsonl",
      "{\"step\": 1, \"moe_layers\": [{\"layer\": 1, \"tokens_per_expert\": [1, 1, 1, 1, 1, 1]}, "
      "{\"layer\": 2, \"tokens_per_expert\": [1, 1, 1, 1, 1, 1]}]}\n"
      "{\"step\": 2, \"moe_layers\": [{\"layer\": 1, \"tokens_per_expert\": [6, 2, 4, 4, 4, 4]}, "
      "{\"layer\": 2, \"tokens_per_expert\": [8, 4, 4, 2, 2, 4]}]}\n"
      "{\"eval_loss\": 3.0}\n");
  const Routing routing = measured_routing(path, moe_config());
  EXPECT_EQ(routing.weights, (std::vector<std::vector<double>>{{1.5, 0.5, 1, 1, 1, 1}, {2, 1, 1, 0.5, 0.5, 1}}));
  EXPECT_TRUE(routing.rank_loads.empty()) << "one rank's run";
  EXPECT_DOUBLE_EQ(received_imbalance(routing, 2), 4.0 / 3) << "layer 2's first three experts";
  EXPECT_DOUBLE_EQ(received_imbalance(routing, 3), 1.5) << "layer 2's first two experts";

  EXPECT_NE(error_of(::testing::TempDir() + "missing.jsonl").find("missing.jsonl: cannot open"), std::string::npos);
  const std::string none = write_metrics("traffic_none.jsonl", "{\"step\": 1, \"loss\": 2.0}\n");
  EXPECT_NE(error_of(none).find("no step record with \"moe_layers\""), std::string::npos) << error_of(none);
  const std::string one = write_metrics(
      "traffic_one.jsonl", "{\"moe_layers\": [{\"layer\": 1, \"tokens_per_expert\": [1, 1, 1, 1, 1, 1]}]}\n");
  EXPECT_NE(error_of(one).find("traffic_one.jsonl:1: \"moe_layers\" has 1 layers; expected 2"), std::string::npos)
      << error_of(one);
  const std::string five = write_metrics("traffic_five.jsonl",
                                         "{\"moe_layers\": [{\"layer\": 1, \"tokens_per_expert\": [1, 1, 1, 1, 1]}, "
                                         "{\"layer\": 2, \"tokens_per_expert\": [1, 1, 1, 1, 1, 1]}]}\n");
  EXPECT_NE(error_of(five).find("traffic_five.jsonl:1: \"tokens_per_expert\" of layer 1 has 5 experts; expected 6"),
            std::string::npos)
      << error_of(five);
  const std::string broken = write_metrics("traffic_broken.jsonl", "{\"step\": 1}\n{\"step\": \n");
  EXPECT_NE(error_of(broken).find("traffic_broken.jsonl:2: not a JSON record"), std::string::npos) << error_of(broken);
}

TEST(StepTraffic, RatesParseWithDecimalSuffixes) {
  EXPECT_DOUBLE_EQ(parse_rate("989T", "--device-flops"), 989e12);
  EXPECT_DOUBLE_EQ(parse_rate("450G", "--intra-bandwidth"), 450e9);
  EXPECT_DOUBLE_EQ(parse_rate("1.5e12", "--device-flops"), 1.5e12);
  for (const char* bad : {"fast", "-3G", "0", "5X", "G"}) {
    try {
      parse_rate(bad, "--inter-bandwidth");
      ADD_FAILURE() << bad << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--inter-bandwidth ") + bad + ": expected a positive rate"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace trillion
