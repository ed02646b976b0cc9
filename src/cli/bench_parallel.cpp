// `trillion bench`'s subcommands for several ranks, run under mpirun (one process is a group of one):
//   mpirun -np N trillion bench moe-parallel --config MODEL.json [--json] [--batch B] [--seq-len T]
//                      [--steps N] [--rounds R] [--warmup N] [--ep E] [--chunks K] [--seed S]
//   mpirun -np CP trillion bench context-parallel [--json] [--mixer M]
//                      (M: attention|sparse|mla|sparse_mla|gated_deltanet|kda|conv)
//                      [--seq-len T] [--batch B] [--heads H] [--kv-heads K] [--head-dim d] [--v-dim v]
//                      [--doc-len N] [--index-heads H_I --index-dim d_I --topk K] [--conv-width W]
//                      [--rope-dim R --latent-dim L --adapter-rank A]
//                      [--dtype float|double] [--runs N] [--seed S]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/context_parallel_bench.h"
#include "bench/moe_parallel_bench.h"
#include "cli/commands.h"
#include "parallel/process_group.h"

namespace trillion {
namespace {

// `trillion bench moe-parallel`.
void add_moe_parallel_bench(CLI::App* bench) {
  CLI::App* mp = bench->add_subcommand(
      "moe-parallel", "Under mpirun: training steps with the expert exchange serial and pipelined over chunks");
  auto mp_json = std::make_shared<bool>(false);
  auto mo = std::make_shared<MoeParallelBenchOptions>();
  mp->add_option("--config", mo->config, "Model config.json with MoE layers")->required();
  mp->add_flag("--json", *mp_json, "One JSON line: the summary (rank 0)");
  mp->add_option("--batch", mo->batch, "Global sequences per step")->capture_default_str();
  mp->add_option("--seq-len", mo->seq_len, "Tokens per sequence")->capture_default_str();
  mp->add_option("--steps", mo->steps, "Timed steps per round and mode")->capture_default_str();
  mp->add_option("--rounds", mo->rounds, "Alternating rounds of both modes")->capture_default_str();
  mp->add_option("--warmup", mo->warmup, "Untimed steps per round and mode")->capture_default_str();
  mp->add_option("--ep", mo->ep, "Expert-parallel degree")->capture_default_str();
  mp->add_option("--chunks", mo->chunks, "Token chunks of the pipelined mode")->capture_default_str();
  mp->add_option("--seed", mo->seed, "Seed of the weights and tokens")->capture_default_str();
  mp->callback([mp_json, mo] {
    const nlohmann::json summary = run_moe_parallel_bench(*mo);
    if (!ProcessGroup::world().is_root()) return;
    if (*mp_json) {
      std::printf("%s\n", summary.dump().c_str());
      return;
    }
    const nlohmann::json &serial = summary.at("serial"), &pipelined = summary.at("pipelined");
    std::printf(
        "moe-parallel %s on %d ranks, ep %d: serial %.4f s/step (exchange wait %.4f s), %d chunks %.4f s/step "
        "(wait %.4f s): speedup %.3f, hidden %.1f%% of the exchange wait\n",
        mo->config.c_str(), summary.at("ranks").get<int>(), mo->ep, serial.at("step_s").get<double>(),
        serial.at("wait_s").get<double>(), mo->chunks, pipelined.at("step_s").get<double>(),
        pipelined.at("wait_s").get<double>(), summary.at("speedup").get<double>(),
        100.0 * summary.at("hidden_fraction").get<double>());
  });
}

// `trillion bench context-parallel`.
void add_context_parallel_bench(CLI::App* bench) {
  CLI::App* cp = bench->add_subcommand("context-parallel",
                                       "Under mpirun -np CP: a sequence mixer over long sequences split over the ranks");
  auto cp_json = std::make_shared<bool>(false);
  auto co = std::make_shared<ContextParallelBenchOptions>();
  auto dtype = std::make_shared<std::string>("float");
  cp->add_flag("--json", *cp_json, "One JSON line: the summary (rank 0)");
  cp->add_option("--mixer", co->mixer,
                 "attention, sparse (attention over the lightning indexer's top-k), mla (absorbed over the gathered "
                 "latent rows: --head-dim is its qk_nope head dim), sparse_mla (MLA over the indexer's top-k), "
                 "gated_deltanet (the delta rule, per-head decay), kda (per key channel): --heads, --head-dim and "
                 "--v-dim are its heads, K and V; or conv (the short convolution: heads · head dim channels, "
                 "--conv-width taps)")
      ->check(CLI::IsMember({"attention", "sparse", "mla", "sparse_mla", "gated_deltanet", "kda", "conv"}))
      ->capture_default_str();
  cp->add_option("--seq-len", co->seq_len, "Tokens per sequence (split over the ranks)")->capture_default_str();
  cp->add_option("--batch", co->batch, "Sequences")->capture_default_str();
  cp->add_option("--heads", co->heads, "Query heads")->capture_default_str();
  cp->add_option("--kv-heads", co->kv_heads, "Key/value heads")->capture_default_str();
  cp->add_option("--head-dim", co->head_dim, "Query/key head dim")->capture_default_str();
  cp->add_option("--v-dim", co->v_dim, "Value head dim (0: the head dim)")->capture_default_str();
  cp->add_option("--doc-len", co->doc_len, "Tokens per packed document (document masks; 0: none)")
      ->capture_default_str();
  cp->add_option("--conv-width", co->conv_width, "conv: the kernel's taps (its channels: heads · head dim)")
      ->capture_default_str();
  cp->add_option("--index-heads", co->index_heads, "sparse, sparse_mla: the indexer's heads")->capture_default_str();
  cp->add_option("--index-dim", co->index_dim, "sparse, sparse_mla: the indexer's head dim")->capture_default_str();
  cp->add_option("--topk", co->topk, "sparse, sparse_mla: keys each query selects")->capture_default_str();
  cp->add_option("--rope-dim", co->rope_dim, "mla, sparse_mla: the rope head dim")->capture_default_str();
  cp->add_option("--latent-dim", co->latent_dim, "mla, sparse_mla: kv_lora_rank")->capture_default_str();
  cp->add_option("--adapter-rank", co->adapter_rank, "mla, sparse_mla: a LoRA adapter's rank on kv_b_proj (0: none)")
      ->capture_default_str();
  cp->add_option("--dtype", *dtype, "Element type")->check(CLI::IsMember({"float", "double"}))->capture_default_str();
  cp->add_option("--runs", co->runs, "Timed forward + backward runs")->capture_default_str();
  cp->add_option("--seed", co->seed, "Seed of the inputs")->capture_default_str();
  cp->callback([cp_json, co, dtype] {
    co->use_double = *dtype == "double";
    const nlohmann::json s = run_context_parallel_bench(*co);
    if (!ProcessGroup::world().is_root()) return;
    if (*cp_json) {
      std::printf("%s\n", s.dump().c_str());
      return;
    }
    std::printf(
        "context-parallel %s, cp %d, %lld tokens: forward+backward %.4f s (median of %d), peak %.1f "
        "MiB per rank = %.3f of one rank's, received %.1f MiB forward and %.1f MiB backward per rank "
        "(plan: %s), max rel err %.2e\n",
        s.at("mixer").get<std::string>().c_str(), s.at("cp").get<int>(), s.at("seq_len").get<long long>(),
        s.at("median_s").get<double>(), s.at("runs").get<int>(), s.at("peak_bytes").get<double>() / (1 << 20),
        s.at("peak_ratio").get<double>(), s.at("forward_received_bytes").get<double>() / (1 << 20),
        s.at("backward_received_bytes").get<double>() / (1 << 20),
        s.at("traffic_matches_plan").get<bool>() ? "equal" : "DIFFERENT", s.at("max_rel_err").get<double>());
  });
}

}  // namespace

void add_parallel_benches(CLI::App* bench) {
  add_moe_parallel_bench(bench);
  add_context_parallel_bench(bench);
}

}  // namespace trillion
