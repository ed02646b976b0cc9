// `trillion bench`: measured performance of the engine's kernels on this machine.
//   trillion bench gemm [--json] [--size N] [--shape m,n,k]   each float backend's sgemm GFLOP/s
//   trillion bench attention [--json] [--seq-len T] [--heads H] [--kv-heads K] [--head-dim d]
//                            [--batch B] [--runs N] [--baseline-runs N] [--gemm-size N]
//   trillion bench moe [--json] [--tokens T] [--hidden H] [--experts E] [--top-k k] [--expert-width I]
//                      [--runs N] [--baseline-runs N] [--gemm-size N] [--seed S]
//   trillion bench linear-attention [--json] [--tokens T] [--heads H] [--key-dim K] [--value-dim V]
//                      [--decay per_head|per_key_channel|both] [--runs N] [--baseline-runs N]
//                      [--gemm-size N] [--seed S]
//   trillion bench sparse-attention [--json] [--seq-len T] [--batch B] [--heads H] [--kv-heads K]
//                      [--head-dim d] [--v-dim v] [--index-heads H_I] [--index-head-dim d_I] [--topk k]
//                      [--mla-heads H] [--runs N] [--baseline-runs N] [--gemm-size N] [--seed S]
//                      [--precision fp32|bf16]
//   trillion bench tiles [--json] [--runs N]
//   trillion bench loss [--json] [--tokens T] [--hidden H] [--vocab V] [--z-loss z] [--precision P] [--runs N]
//                      [--baseline-runs N] [--gemm-size N]
//   trillion bench step --config MODEL.json [--json] [--batch B] [--seq-len T] [--steps N]
//                      [--warmup N] [--seed S] [--gemm-size N]
//   mpirun -np N trillion bench moe-parallel | context-parallel …   (cli/bench_parallel.cpp)
//   (--runs and --baseline-runs default to 10, the minimum for a measurement; fewer is a smoke test;
//   sparse-attention's plain baseline defaults to 2 runs, as it is slow at its default size)
// With --json each measurement is one JSON line and the last line is the summary; without it the
// same numbers are printed for people.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "bench/attention_bench.h"
#include "bench/linear_attention_bench.h"
#include "bench/loss_bench.h"
#include "bench/tile_gemm_bench.h"
#include "bench/moe_bench.h"
#include "bench/sparse_attention_bench.h"
#include "bench/physical_peak.h"
#include "bench/step_bench.h"
#include "bench/timing.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "parallel/process_group.h"

namespace trillion {
namespace {

void print_json(const nlohmann::json& j) { std::printf("%s\n", j.dump().c_str()); }

void print_measurement(const nlohmann::json& j) {
  const std::string what = j.at("measurement");
  if (what == "sgemm_ceiling") {
    std::printf("sgemm %lld³: %.1f GFLOP/s (median %.4f s of %d runs)\n", j.at("size").get<long long>(),
                j.at("gflops").get<double>(), j.at("median_s").get<double>(), j.at("runs").get<int>());
  } else {
    std::printf("%-10s forward+backward: median %.4f s (min %.4f s, %d runs), %.1f GFLOP/s, peak %.1f MiB\n",
                what.c_str(), j.at("median_s").get<double>(), j.at("min_s").get<double>(), j.at("runs").get<int>(),
                j.at("gflops").get<double>(), j.at("peak_bytes").get<double>() / (1 << 20));
  }
}

// Each float backend's sgemm at size³ (or m × n × k); the summary's top-level rate is the backend in
// use's (--gemm), every backend's is under "backends"; then bf16 operands with float accumulation,
// stored in bf16 ("bf16") and rounded by each product ("bf16_rounding").
void run_gemm(bool json, int64_t size, const std::vector<int64_t>& shape) {
  if (size < 1) fail("bench gemm: --size must be ≥ 1, got ", size);
  if (!shape.empty() && (shape.size() != 3 || *std::min_element(shape.begin(), shape.end()) < 1))
    fail("bench gemm: --shape must be three sizes ≥ 1 (m,n,k)");
  const int64_t m = shape.empty() ? size : shape[0], n = shape.empty() ? size : shape[1];
  const int64_t k = shape.empty() ? size : shape[2];
  const GemmBackend in_use = gemm_backend();
  SgemmProblem gemm(m, n, k);
  nlohmann::json summary = {{"bench", "gemm"},          {"size", size},
                            {"shape", {m, n, k}},       {"threads", num_threads()},
                            {"backend", gemm_backend_name(in_use)}};
  for (const GemmBackend backend : {GemmBackend::onednn, GemmBackend::openblas}) {
    set_gemm_backend(backend);
    const TimingResult timing = time_median([&] { gemm.run(); }, 2, 10);
    const nlohmann::json result = {{"gflops", gemm.flops() / timing.median_s * 1e-9}, {"median_s", timing.median_s},
                                   {"min_s", timing.min_s}, {"runs", timing.runs},
                                   {"max_rel_err", gemm.sampled_rel_err()}};
    summary["backends"][gemm_backend_name(backend)] = result;
    if (backend == in_use) summary.update(result);
    if (!json)
      std::printf("sgemm %lld×%lld×%lld on %d threads, %-8s: %.1f GFLOP/s (median %.4f s, min %.4f s, %d runs), "
                  "max rel err %.1e\n",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), num_threads(),
                  gemm_backend_name(backend),
                  result.at("gflops").get<double>(), timing.median_s, timing.min_s, timing.runs,
                  result.at("max_rel_err").get<double>());
  }
  set_gemm_backend(in_use);
  // bf16 operands: stored in bf16 (gemm_bf16), and float operands rounded by each product (the
  // engine's products under --precision bf16), on the backend in use.
  const auto bf16_row = [&](const char* name, const char* what, const auto& run) {
    const TimingResult timing = time_median(run, 2, 10);
    summary[name] = {{"gflops", gemm.flops() / timing.median_s * 1e-9}, {"median_s", timing.median_s},
                     {"min_s", timing.min_s}, {"runs", timing.runs},
                     {"max_rel_err", gemm.sampled_rel_err(/*bf16_operands=*/true)}};
    if (!json)
      std::printf("%s: %.1f GFLOP/s (median %.4f s, min %.4f s, %d runs), max rel err %.1e against its rounded "
                  "operands\n",
                  what, summary[name].at("gflops").get<double>(), timing.median_s, timing.min_s, timing.runs,
                  summary[name].at("max_rel_err").get<double>());
  };
  summary["bf16_native"] = bf16_matmul_is_native();
  if (!json)
    std::printf("bf16 operands, float accumulation (%s):\n",
                bf16_matmul_is_native() ? "oneDNN's bf16 matmul" : "no bf16 kernel on this CPU: widened to float");
  bf16_row("bf16", "  stored bf16        ", [&] { gemm.run_bf16(); });
  {
    const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
    bf16_row("bf16_rounding", "  rounded per product", [&] { gemm.run(); });
  }
  // Each rate against the physical peak of its precision.
  const PhysicalPeak peak = measure_physical_peak();
  summary["peak"] = {{"fp32_gflops", peak.fp32_flops() * 1e-9}, {"bf16_gflops", peak.bf16_flops() * 1e-9},
                     {"fp32_formula", peak.formula(MatmulPrecision::fp32)},
                     {"bf16_formula", peak.formula(MatmulPrecision::bf16)}};
  for (auto& [name, result] : summary["backends"].items())
    result["peak_fraction"] = result.at("gflops").get<double>() * 1e9 / peak.fp32_flops();
  for (const char* name : {"bf16", "bf16_rounding"})
    summary[name]["peak_fraction"] = summary[name].at("gflops").get<double>() * 1e9 / peak.bf16_flops();
  summary["peak_fraction"] = summary.at("gflops").get<double>() * 1e9 / peak.fp32_flops();
  if (!json)
    std::printf("physical peak, fp32: %s\n               bf16: %s\nfraction of it: %s fp32 %.2f, openblas %.2f, "
                "bf16 stored %.2f\n",
                peak.formula(MatmulPrecision::fp32).c_str(), peak.formula(MatmulPrecision::bf16).c_str(),
                gemm_backend_name(in_use), summary.at("peak_fraction").get<double>(),
                summary["backends"]["openblas"].at("peak_fraction").get<double>(),
                summary["bf16"].at("peak_fraction").get<double>());
  const nlohmann::json& rates = summary.at("backends");
  summary["onednn_over_openblas"] = rates.at("onednn").at("gflops").get<double>() / rates.at("openblas").at("gflops").get<double>();
  summary["bf16_over_fp32"] = summary.at("bf16").at("gflops").get<double>() / summary.at("gflops").get<double>();
  if (json) print_json(summary);
  else
    std::printf("onednn / openblas: %.2f, bf16 / fp32 (%s): %.2f\n", summary.at("onednn_over_openblas").get<double>(),
                gemm_backend_name(in_use), summary.at("bf16_over_fp32").get<double>());
}

void run_attention(bool json, const AttentionBenchOptions& options) {
  if (options.runs < 10 || options.baseline_runs < 10)
    std::fprintf(stderr, "bench attention: fewer than 10 runs (--runs %d, --baseline-runs %d): a smoke test, "
                 "not a measurement\n", options.runs, options.baseline_runs);
  const nlohmann::json summary =
      run_attention_bench(options, [&](const nlohmann::json& j) { json ? print_json(j) : print_measurement(j); });
  if (json) {
    print_json(summary);
    return;
  }
  std::printf(
      "attention T=%lld H=%lld Hkv=%lld d=%lld batch=%lld on %d threads:\n"
      "  speedup over reference %.2fx, max relative error %.2e\n"
      "  %.1f GFLOP/s = %.3f of the sgemm ceiling (%.1f GFLOP/s)\n"
      "  peak memory: reference / tiled = %.1f\n",
      summary.at("seq_len").get<long long>(), summary.at("heads").get<long long>(),
      summary.at("kv_heads").get<long long>(), summary.at("head_dim").get<long long>(),
      summary.at("batch").get<long long>(), num_threads(), summary.at("speedup").get<double>(),
      summary.at("max_rel_err").get<double>(), summary.at("fused_gflops").get<double>(),
      summary.at("ceiling_fraction").get<double>(), summary.at("ceiling_gflops").get<double>(),
      summary.at("memory_ratio").get<double>());
}

void run_moe(bool json, const MoeBenchOptions& options) {
  if (options.runs < 10 || options.baseline_runs < 10)
    std::fprintf(stderr, "bench moe: fewer than 10 runs (--runs %d, --baseline-runs %d): a smoke test, "
                 "not a measurement\n", options.runs, options.baseline_runs);
  const nlohmann::json summary = run_moe_bench(options, [&](const nlohmann::json& j) {
    if (json) {
      print_json(j);
      return;
    }
    print_measurement(j);
    if (j.contains("experts_forward_s"))
      std::printf("           phases (median s): router %.4f, plan %.4f, experts forward %.4f, "
                  "experts backward %.4f, router backward %.4f\n",
                  j.at("router_forward_s").get<double>(), j.at("plan_s").get<double>(),
                  j.at("experts_forward_s").get<double>(), j.at("experts_backward_s").get<double>(),
                  j.at("router_backward_s").get<double>());
  });
  if (json) {
    print_json(summary);
    return;
  }
  std::printf(
      "moe T=%lld H=%lld E=%lld k=%lld I=%lld on %d threads (tokens per expert: max %lld, mean %.1f):\n"
      "  speedup over fragmented %.2fx, max relative error %.2e\n"
      "  %.1f GFLOP/s = %.3f of the sgemm ceiling (%.1f GFLOP/s)\n"
      "  peak memory: fragmented / fused = %.2f\n",
      summary.at("tokens").get<long long>(), summary.at("hidden").get<long long>(),
      summary.at("experts").get<long long>(), summary.at("top_k").get<long long>(),
      summary.at("expert_width").get<long long>(), num_threads(),
      summary.at("tokens_per_expert_max").get<long long>(), summary.at("tokens_per_expert_mean").get<double>(),
      summary.at("speedup").get<double>(), summary.at("max_rel_err").get<double>(),
      summary.at("fused_gflops").get<double>(), summary.at("ceiling_fraction").get<double>(),
      summary.at("ceiling_gflops").get<double>(), summary.at("memory_ratio").get<double>());
}

// Text form of one decay kind's summary (or of the combined one's fields).
void print_linear_attention_summary(const nlohmann::json& s) {
  std::printf(
      "linear-attention decay=%s T=%lld H=%lld K=%lld V=%lld on %d threads:\n"
      "  speedup over recurrent %.2fx, max relative error %.2e\n"
      "  %.1f GFLOP/s = %.3f of the sgemm ceiling (%.1f GFLOP/s)\n"
      "  peak memory: recurrent / chunked = %.2f\n",
      s.at("decay").get<std::string>().c_str(), s.at("tokens").get<long long>(), s.at("heads").get<long long>(),
      s.at("key_dim").get<long long>(), s.at("value_dim").get<long long>(), num_threads(),
      s.at("speedup").get<double>(), s.at("max_rel_err").get<double>(), s.at("fused_gflops").get<double>(),
      s.at("ceiling_fraction").get<double>(), s.at("ceiling_gflops").get<double>(),
      s.at("memory_ratio").get<double>());
}

void run_linear_attention(bool json, const LinearAttentionBenchOptions& options) {
  if (options.runs < 10 || options.baseline_runs < 10)
    std::fprintf(stderr, "bench linear-attention: fewer than 10 runs (--runs %d, --baseline-runs %d): a smoke test, "
                 "not a measurement\n", options.runs, options.baseline_runs);
  const nlohmann::json summary = run_linear_attention_bench(options, [&](const nlohmann::json& j) {
    if (json) {
      print_json(j);
      return;
    }
    if (!j.contains("measurement")) {
      print_linear_attention_summary(j);
      return;
    }
    if (j.at("measurement") != "sgemm_ceiling") std::printf("[%s] ", j.at("decay").get<std::string>().c_str());
    print_measurement(j);
    if (j.contains("forward_s"))
      std::printf("           phases (median s): forward %.4f, backward %.4f\n", j.at("forward_s").get<double>(),
                  j.at("backward_s").get<double>());
  });
  if (json) {
    print_json(summary);
    return;
  }
  if (summary.at("decay") != "both") {
    print_linear_attention_summary(summary);
    return;
  }
  std::printf(
      "linear-attention, both decay kinds: speedup (per_head) %.2fx, max relative error %.2e, "
      "ceiling fraction (lowest, %s) %.3f, memory ratio (lowest) %.2f\n",
      summary.at("speedup").get<double>(), summary.at("max_rel_err").get<double>(),
      summary.at("ceiling_fraction_decay").get<std::string>().c_str(), summary.at("ceiling_fraction").get<double>(),
      summary.at("memory_ratio").get<double>());
}

void run_sparse_attention(bool json, const SparseAttentionBenchOptions& options) {
  if (options.runs < 10)
    std::fprintf(stderr, "bench sparse-attention: fewer than 10 runs (--runs %d): a smoke test, not a measurement\n",
                 options.runs);
  const nlohmann::json summary = run_sparse_attention_bench(options, [&](const nlohmann::json& j) {
    if (json) {
      print_json(j);
      return;
    }
    std::printf("%-20s median %.4f s (min %.4f s, %d runs)", j.at("measurement").get<std::string>().c_str(),
                j.at("median_s").get<double>(), j.at("min_s").get<double>(), j.at("runs").get<int>());
    if (j.contains("gflops")) std::printf(", %.1f GFLOP/s", j.at("gflops").get<double>());
    if (j.contains("peak_bytes")) std::printf(", peak %.1f MiB", j.at("peak_bytes").get<double>() / (1 << 20));
    std::printf("\n");
    if (j.contains("backward_s"))
      std::printf("                     phases (median s): indexer top-k %.4f, forward %.4f, backward %.4f\n",
                  j.at("indexer_topk_s").get<double>(), j.at("forward_s").get<double>(),
                  j.at("backward_s").get<double>());
  });
  if (json) {
    print_json(summary);
    return;
  }
  std::printf(
      "sparse-attention T=%lld H=%lld Hkv=%lld qk=%lld v=%lld H_I=%lld d_I=%lld topk=%lld batch=%lld %s on %d threads:\n"
      "  speedup over dense %.2fx, plain / sparse %.2f, max relative error %.2e (%lld top-k rows differ)\n"
      "  %.1f GFLOP/s = %.3f of the sgemm ceiling (%.1f GFLOP/s)\n"
      "  indexer loss: dense mode %.4f s, sparse mode %.4f s\n"
      "  peak memory: dense / sparse = %.2f\n",
      summary.at("seq_len").get<long long>(), summary.at("heads").get<long long>(),
      summary.at("kv_heads").get<long long>(), summary.at("head_dim").get<long long>(),
      summary.at("v_dim").get<long long>(), summary.at("index_heads").get<long long>(),
      summary.at("index_head_dim").get<long long>(), summary.at("topk").get<long long>(),
      summary.at("batch").get<long long>(), summary.at("precision").get<std::string>().c_str(), num_threads(),
      summary.at("speedup").get<double>(),
      summary.at("ratio_plain").get<double>(), summary.at("max_rel_err").get<double>(),
      summary.at("topk_mismatch_rows").get<long long>(), summary.at("fused_gflops").get<double>(),
      summary.at("ceiling_fraction").get<double>(), summary.at("ceiling_gflops").get<double>(),
      summary.at("indexer_loss_dense_s").get<double>(), summary.at("indexer_loss_sparse_s").get<double>(),
      summary.at("memory_ratio").get<double>());
  if (summary.contains("mla_speedup"))
    std::printf("  MLA (qk 192, v 128, %lld heads = kv heads): speedup over dense %.2fx\n",
                summary.at("mla_heads").get<long long>(), summary.at("mla_speedup").get<double>());
}

void run_step(bool json, const StepBenchOptions& options) {
  if (options.steps < 10)
    std::fprintf(stderr, "bench step: fewer than 10 steps (--steps %d): a smoke test, not a measurement\n",
                 options.steps);
  const nlohmann::json summary = run_step_bench(options);
  if (json) {
    print_json(summary);
    return;
  }
  std::printf("step %s, batch %lld x %lld, %d threads (%s, %s operands): median %.4f s (min %.4f s, %d steps), "
              "%.0f tokens/s\n  MFU %.3f of the sgemm rate (%.1f GFLOP/s at %lld³), %.3f of the physical peak (%s)\n"
              "  per step:",
              summary.at("config").get<std::string>().c_str(), summary.at("batch").get<long long>(),
              summary.at("seq_len").get<long long>(), summary.at("threads").get<int>(),
              summary.at("vector_isa").get<std::string>().c_str(),
              summary.at("precision").get<std::string>().c_str(), summary.at("step_s").get<double>(),
              summary.at("min_step_s").get<double>(), summary.at("steps").get<int>(),
              summary.at("tokens_per_s").get<double>(), summary.at("mfu").get<double>(),
              summary.at("sgemm_gflops").get<double>(), summary.at("ceiling_gemm_size").get<long long>(),
              summary.at("mfu_peak").get<double>(), summary.at("peak_formula").get<std::string>().c_str());
  const double mean = summary.at("mean_step_s").get<double>();
  for (const auto& [name, seconds] : summary.at("phases_s").items())
    std::printf(" %s %.1f%%", name.c_str(), 100.0 * seconds.get<double>() / mean);
  std::printf(" idle %.1f%% (sum %.1f%% of the step)\n", 100.0 * summary.at("idle_s").get<double>() / mean,
              100.0 * summary.at("coverage").get<double>());
}

void run_loss(bool json, const LossBenchOptions& options) {
  if (options.runs < 10 || options.baseline_runs < 10)
    std::fprintf(stderr, "bench loss: fewer than 10 runs (--runs %d, --baseline-runs %d): a smoke test, "
                 "not a measurement\n", options.runs, options.baseline_runs);
  const nlohmann::json summary =
      run_loss_bench(options, [&](const nlohmann::json& j) { json ? print_json(j) : print_measurement(j); });
  if (json) {
    print_json(summary);
    return;
  }
  if (summary.contains("dlogits_copy_speedup"))
    std::printf("bf16: the dlogits copy speeds the fused path up %.3fx (%s bits)\n",
                summary.at("dlogits_copy_speedup").get<double>(),
                summary.at("dlogits_copy_same_bits").get<bool>() ? "the same" : "DIFFERENT");
  std::printf(
      "loss tokens=%lld hidden=%lld vocab=%lld z-loss=%g on %d threads (fused row chunk %lld):\n"
      "  speedup over plain %.2fx, recompute / fused %.2f, max relative error %.2e\n"
      "  %.1f GFLOP/s = %.3f of the sgemm ceiling (%.1f GFLOP/s)\n"
      "  peak extra memory: plain / fused = %.1f\n",
      summary.at("tokens").get<long long>(), summary.at("hidden").get<long long>(),
      summary.at("vocab").get<long long>(), summary.at("z_loss").get<double>(), num_threads(),
      summary.at("fused_row_chunk").get<long long>(), summary.at("speedup").get<double>(),
      summary.at("ratio_recompute").get<double>(), summary.at("max_rel_err").get<double>(),
      summary.at("fused_gflops").get<double>(), summary.at("ceiling_fraction").get<double>(),
      summary.at("ceiling_gflops").get<double>(), summary.at("memory_ratio").get<double>());
}

void run_tiles(bool json, const TileBenchOptions& options) {
  if (options.runs < 10) std::fprintf(stderr, "bench tiles: fewer than 10 runs: a smoke test, not a measurement\n");
  const nlohmann::json summary = run_tile_bench(options, [&](const nlohmann::json& j) {
    if (json) return print_json(j);
    const auto rate = [](const nlohmann::json& path) { return path.is_null() ? 0.0 : path.at("gflops").get<double>(); };
    std::printf("%-34s fp32: oneDNN %6.1f, libxsmm %6.1f GFLOP/s | bf16: oneDNN %6.1f, libxsmm %6.1f GFLOP/s\n",
                j.at("shape").get<std::string>().c_str(), rate(j.at("onednn_fp32")), rate(j.at("libxsmm_fp32")),
                rate(j.at("onednn_bf16")), rate(j.at("libxsmm_bf16")));
  });
  if (json) return print_json(summary);
  std::printf("one thread; the engine's gemm on %s, libxsmm target %s (0: no kernel for the layout); libxsmm "
              "faster on %zu of %d shapes in fp32, %zu in bf16\n",
              summary.at("gemm_backend").get<std::string>().c_str(),
              summary.at("libxsmm_target").get<std::string>().c_str(), summary.at("libxsmm_faster_fp32").size(),
              summary.at("shapes").get<int>(), summary.at("libxsmm_faster_bf16").size());
}

// `trillion bench tiles`.
void add_tiles_bench(CLI::App* bench) {
  CLI::App* tiles = bench->add_subcommand(
      "tiles", "The kernels' per-tile products on one thread: oneDNN against libxsmm's JIT kernels, fp32 and bf16");
  auto json = std::make_shared<bool>(false);
  auto options = std::make_shared<TileBenchOptions>();
  tiles->add_flag("--json", *json, "JSON lines: one per shape, then the summary");
  tiles->add_option("--runs", options->runs, "Timed runs per path (median; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  tiles->callback([json, options] { run_tiles(*json, *options); });
}

// `trillion bench gemm`.
void add_gemm_bench(CLI::App* bench) {
  CLI::App* gemm =
      bench->add_subcommand("gemm", "sgemm GFLOP/s of each float backend at size³ (median of 10 runs after warm-up)");
  auto gemm_json = std::make_shared<bool>(false);
  auto gemm_size = std::make_shared<int64_t>(2048);
  auto gemm_shape = std::make_shared<std::vector<int64_t>>();
  gemm->add_flag("--json", *gemm_json, "One JSON line instead of text");
  gemm->add_option("--size", *gemm_size, "Matrix size N of the N×N×N product")->capture_default_str();
  gemm->add_option("--shape", *gemm_shape, "m,n,k of an [m, k] · [k, n] product instead")->delimiter(',');
  gemm->callback([gemm_json, gemm_size, gemm_shape] { run_gemm(*gemm_json, *gemm_size, *gemm_shape); });
}

// `trillion bench attention`.
void add_attention_bench(CLI::App* bench) {
  CLI::App* attention =
      bench->add_subcommand("attention", "Tiled causal GQA attention forward+backward vs the plain reference");
  auto attention_json = std::make_shared<bool>(false);
  auto options = std::make_shared<AttentionBenchOptions>();
  attention->add_flag("--json", *attention_json, "JSON lines: one per measurement, then the summary");
  attention->add_option("--seq-len", options->seq_len, "Sequence length T")->capture_default_str();
  attention->add_option("--heads", options->heads, "Query heads")->capture_default_str();
  attention->add_option("--kv-heads", options->kv_heads, "Key/value heads")->capture_default_str();
  attention->add_option("--head-dim", options->head_dim, "Head dimension")->capture_default_str();
  attention->add_option("--batch", options->batch, "Batch size")->capture_default_str();
  attention
      ->add_option("--runs", options->runs,
                   "Timed runs of the tiled kernel (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  attention
      ->add_option("--baseline-runs", options->baseline_runs,
                   "Timed runs of the reference (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  attention->add_option("--gemm-size", options->gemm_size, "Size of the sgemm that sets the ceiling")
      ->capture_default_str();
  attention->callback([attention_json, options] { run_attention(*attention_json, *options); });
}

// `trillion bench moe`.
void add_moe_bench(CLI::App* bench) {
  CLI::App* moe = bench->add_subcommand(
      "moe", "MoE layer (router + fused experts) forward+backward vs the fragmented expert baseline");
  auto moe_json = std::make_shared<bool>(false);
  auto moe_options = std::make_shared<MoeBenchOptions>();
  moe->add_flag("--json", *moe_json, "JSON lines: one per measurement, then the summary");
  moe->add_option("--tokens", moe_options->tokens, "Tokens T")->capture_default_str();
  moe->add_option("--hidden", moe_options->hidden, "Hidden size H")->capture_default_str();
  moe->add_option("--experts", moe_options->experts, "Routed experts E")->capture_default_str();
  moe->add_option("--top-k", moe_options->top_k, "Experts per token k")->capture_default_str();
  moe->add_option("--expert-width", moe_options->expert_width, "Expert intermediate size I")->capture_default_str();
  moe->add_option("--runs", moe_options->runs,
                  "Timed runs of the fused chain (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  moe->add_option("--baseline-runs", moe_options->baseline_runs,
                  "Timed runs of the fragmented chain (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  moe->add_option("--gemm-size", moe_options->gemm_size, "Size of the sgemm that sets the ceiling")
      ->capture_default_str();
  moe->add_option("--seed", moe_options->seed, "Seed of the inputs and weights")->capture_default_str();
  moe->callback([moe_json, moe_options] { run_moe(*moe_json, *moe_options); });
}

// `trillion bench linear-attention`.
void add_linear_attention_bench(CLI::App* bench) {
  CLI::App* linear = bench->add_subcommand(
      "linear-attention", "Chunked gated delta rule forward+backward vs the recurrent kernel");
  auto linear_json = std::make_shared<bool>(false);
  auto linear_options = std::make_shared<LinearAttentionBenchOptions>();
  linear->add_flag("--json", *linear_json, "JSON lines: one per measurement and per decay kind, then the summary");
  linear->add_option("--tokens", linear_options->tokens, "Tokens T (batch 1, one segment)")->capture_default_str();
  linear->add_option("--heads", linear_options->heads, "Value heads H (key heads already repeated)")
      ->capture_default_str();
  linear->add_option("--key-dim", linear_options->key_dim, "Key head dimension K")->capture_default_str();
  linear->add_option("--value-dim", linear_options->value_dim, "Value head dimension V")->capture_default_str();
  linear->add_option("--decay", linear_options->decay, "Decay kind: per_head, per_key_channel or both")
      ->check(CLI::IsMember({"per_head", "per_key_channel", "both"}))
      ->capture_default_str();
  linear->add_option("--runs", linear_options->runs,
                     "Timed runs of the chunked kernel (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  linear->add_option("--baseline-runs", linear_options->baseline_runs,
                     "Timed runs of the recurrent kernel (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  linear->add_option("--gemm-size", linear_options->gemm_size, "Size of the sgemm that sets the ceiling")
      ->capture_default_str();
  linear->add_option("--seed", linear_options->seed, "Seed of the inputs")->capture_default_str();
  linear->callback([linear_json, linear_options] { run_linear_attention(*linear_json, *linear_options); });
}

// `trillion bench sparse-attention`.
void add_sparse_attention_bench(CLI::App* bench) {
  CLI::App* sparse = bench->add_subcommand(
      "sparse-attention", "DeepSeek sparse attention (indexer top-k + sparse fwd+bwd) vs dense causal attention");
  auto sparse_json = std::make_shared<bool>(false);
  auto so = std::make_shared<SparseAttentionBenchOptions>();
  sparse->add_flag("--json", *sparse_json, "JSON lines: one per measurement, then the summary");
  sparse->add_option("--seq-len", so->seq_len, "Sequence length T")->capture_default_str();
  sparse->add_option("--batch", so->batch, "Batch size")->capture_default_str();
  sparse->add_option("--heads", so->heads, "Query heads")->capture_default_str();
  sparse->add_option("--kv-heads", so->kv_heads, "Key/value heads")->capture_default_str();
  sparse->add_option("--head-dim", so->head_dim, "Query/key head dimension")->capture_default_str();
  sparse->add_option("--v-dim", so->v_dim, "Value head dimension (0: --head-dim)")->capture_default_str();
  sparse->add_option("--index-heads", so->index_heads, "Indexer heads H_I")->capture_default_str();
  sparse->add_option("--index-head-dim", so->index_head_dim, "Indexer head dimension d_I")->capture_default_str();
  sparse->add_option("--topk", so->topk, "Keys selected per query")->capture_default_str();
  sparse->add_option("--mla-heads", so->mla_heads, "Heads (= kv heads) of the MLA-shaped line (0 skips it)")
      ->capture_default_str();
  sparse->add_option("--runs", so->runs,
                     "Timed runs of each path but the plain one (median reported; fewer than 10 is for smoke tests)")
      ->capture_default_str();
  sparse->add_option("--baseline-runs", so->baseline_runs, "Timed runs of the slow plain path (after its first)")
      ->capture_default_str();
  sparse->add_option("--gemm-size", so->gemm_size, "Size of the sgemm that sets the ceiling")->capture_default_str();
  sparse->add_option("--seed", so->seed, "Seed of the inputs")->capture_default_str();
  sparse->add_option("--precision", so->precision,
                     "Operands of the timed paths' products: fp32 or bf16 (the sparse kernels' rows, the dense tiles)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  sparse->callback([sparse_json, so] { run_sparse_attention(*sparse_json, *so); });
}

// `trillion bench loss`.
void add_loss_bench(CLI::App* bench) {
  CLI::App* loss = bench->add_subcommand(
      "loss", "LM head cross-entropy with gradients in the forward vs recompute-in-backward and plain 3-gemm");
  auto loss_json = std::make_shared<bool>(false);
  auto lo = std::make_shared<LossBenchOptions>();
  loss->add_flag("--json", *loss_json, "JSON lines: one per measurement, then the summary");
  loss->add_option("--tokens", lo->tokens, "Tokens (rows of the hidden states)")->capture_default_str();
  loss->add_option("--hidden", lo->hidden, "Hidden size")->capture_default_str();
  loss->add_option("--vocab", lo->vocab, "Vocabulary size")->capture_default_str();
  loss->add_option("--z-loss", lo->z_loss, "z-loss coefficient (fused and plain paths)")->capture_default_str();
  loss->add_option("--runs", lo->runs,
                   "Timed runs of the fused path (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  loss->add_option("--baseline-runs", lo->baseline_runs,
                   "Timed runs of the recompute and plain paths (median reported; fewer than 10 is for smoke tests)")
      ->capture_default_str();
  loss->add_option("--gemm-size", lo->gemm_size, "Size of the sgemm that sets the ceiling")->capture_default_str();
  loss->add_option("--precision", lo->precision,
                   "Operands of the products: fp32 or bf16 (bf16 also times the fused path without its dlogits copy)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  loss->callback([loss_json, lo] { run_loss(*loss_json, *lo); });
}

// `trillion bench step`.
void add_step_bench(CLI::App* bench) {
  CLI::App* step = bench->add_subcommand(
      "step", "Whole training steps of a model config (forward, backward, AdamW) with the time per phase");
  auto step_json = std::make_shared<bool>(false);
  auto st = std::make_shared<StepBenchOptions>();
  step->add_option("--config", st->config, "Model config.json")->required();
  step->add_flag("--json", *step_json, "One JSON line: the summary");
  step->add_option("--batch", st->batch, "Sequences per step")->capture_default_str();
  step->add_option("--seq-len", st->seq_len, "Tokens per sequence")->capture_default_str();
  step->add_option("--steps", st->steps, "Timed steps (median reported; fewer than 10 is for smoke tests only)")
      ->capture_default_str();
  step->add_option("--warmup", st->warmup, "Untimed steps first")->capture_default_str();
  step->add_option("--seed", st->seed, "Seed of the weights and tokens")->capture_default_str();
  step->add_option("--gemm-size", st->gemm_size, "Size of the sgemm that sets the MFU ceiling")->capture_default_str();
  step->add_option("--precision", st->precision, "Operands of the products: fp32 or bf16 (float accumulation)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  step->callback([step_json, st] { run_step(*step_json, *st); });
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure kernel performance on this machine");
  bench->require_subcommand(1);
  add_gemm_bench(bench);
  add_attention_bench(bench);
  add_moe_bench(bench);
  add_linear_attention_bench(bench);
  add_sparse_attention_bench(bench);
  add_loss_bench(bench);
  add_step_bench(bench);
  add_parallel_benches(bench);
  add_tiles_bench(bench);
}

}  // namespace trillion
