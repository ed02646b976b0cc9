// `trillion bench attention` (see attention_bench.h).
#include "bench/attention_bench.h"

#include <algorithm>
#include <cmath>

#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/ref/attention_ref.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

// Inputs and outputs of one forward + backward, all in the fast tier.
struct AttentionTensors {
  Buffer<float> out, lse, dq, dk, dv;  // [b, T, H, d], [b, H, T], [b, T, H, d], [b, T, Hkv, d] × 2
  AttentionTensors(const AttentionSizes& s)
      : out(s.batch * s.q_len * s.q_heads * s.head_dim),
        lse(s.batch * s.q_heads * s.q_len),
        dq(s.batch * s.q_len * s.q_heads * s.head_dim),
        dk(s.batch * s.kv_len * s.kv_heads * s.head_dim),
        dv(s.batch * s.kv_len * s.kv_heads * s.head_dim) {}
};

}  // namespace

nlohmann::json run_attention_bench(const AttentionBenchOptions& o,
                                   const std::function<void(const nlohmann::json&)>& emit) {
  if (o.seq_len < 1 || o.head_dim < 1 || o.batch < 1 || o.kv_heads < 1 || o.heads < o.kv_heads)
    fail("bench attention: --seq-len, --head-dim, --batch, --kv-heads must be ≥ 1 and --heads ≥ --kv-heads");
  if (o.heads % o.kv_heads != 0)
    fail("bench attention: --heads ", o.heads, " must be a multiple of --kv-heads ", o.kv_heads);
  if (o.runs < 1 || o.baseline_runs < 1) fail("bench attention: --runs and --baseline-runs must be ≥ 1");
  if (o.gemm_size < 1) fail("bench attention: --gemm-size must be ≥ 1");
  const AttentionSizes s{o.batch, o.seq_len, o.seq_len, o.heads, o.kv_heads, o.head_dim,
                         1.0 / std::sqrt(double(o.head_dim))};
  nlohmann::json sizes = {{"batch", o.batch},       {"seq_len", o.seq_len},   {"heads", o.heads},
                          {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim}, {"threads", num_threads()},
                          {"vector_isa", vector_isa_name(vector_isa())}};

  const int64_t q_count = s.batch * s.q_len * s.q_heads * s.head_dim;
  const int64_t kv_count = s.batch * s.kv_len * s.kv_heads * s.head_dim;
  Buffer<float> q(q_count), dout(q_count), k(kv_count), v(kv_count);  // [b, T, H, d] / [b, T, Hkv, d]
  const CounterRng rng(7, "bench_attention");
  for (int64_t i = 0; i < q_count; ++i) {
    q[i] = float(rng.normal(i));
    dout[i] = float(rng.normal(2 * q_count + i));
  }
  for (int64_t i = 0; i < kv_count; ++i) {
    k[i] = float(rng.normal(4 * q_count + i));
    v[i] = float(rng.normal(4 * q_count + 2 * kv_count + i));
  }
  const int64_t input_bytes = (2 * q_count + 2 * kv_count) * int64_t(sizeof(float));

  AttentionTensors fused(s);
  auto run_fused = [&] {
    attention_forward(fused.out.data(), fused.lse.data(), q.data(), k.data(), v.data(), s);
    attention_backward(fused.dq.data(), fused.dk.data(), fused.dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       fused.out.data(), fused.lse.data(), s);
  };
  const int64_t output_bytes =
      (fused.out.size() + fused.lse.size() + fused.dq.size() + fused.dk.size() + fused.dv.size()) *
      int64_t(sizeof(float));
  const int64_t fused_workspace = peak_extra_bytes(run_fused);
  // The ceiling's sgemm and the tiled kernel alternate, so both see the same load on a shared machine.
  SgemmProblem gemm(o.gemm_size);
  const auto [gemm_time, fused_time] =
      time_interleaved([&] { gemm.run(); }, run_fused, 1, o.runs);
  const double ceiling_gflops = gemm.flops() / gemm_time.median_s * 1e-9;
  emit({{"bench", "attention"}, {"measurement", "sgemm_ceiling"}, {"size", gemm.size()}, {"gflops", ceiling_gflops},
        {"median_s", gemm_time.median_s}, {"min_s", gemm_time.min_s}, {"runs", gemm_time.runs}});
  const double flops = 3.0 * 4.0 * (double(s.q_len) * double(s.q_len + 1) / 2) * double(s.q_heads) *
                       double(s.head_dim) * double(s.batch);
  const double fused_gflops = flops / fused_time.median_s * 1e-9;
  const int64_t fused_peak = input_bytes + output_bytes + fused_workspace;
  emit({{"bench", "attention"}, {"measurement", "fused"}, {"median_s", fused_time.median_s},
        {"min_s", fused_time.min_s}, {"runs", fused_time.runs}, {"gflops", fused_gflops},
        {"peak_bytes", fused_peak}, {"workspace_bytes", fused_workspace}});

  AttentionTensors reference(s);
  auto run_reference = [&] {
    attention_ref_forward(reference.out.data(), reference.lse.data(), q.data(), k.data(), v.data(), s);
    attention_ref_backward(reference.dq.data(), reference.dk.data(), reference.dv.data(), dout.data(), q.data(),
                           k.data(), v.data(), s);
  };
  const int64_t reference_workspace = peak_extra_bytes(run_reference);
  const TimingResult reference_time = time_median(run_reference, 0, o.baseline_runs);
  const int64_t reference_peak = input_bytes + output_bytes + reference_workspace;
  emit({{"bench", "attention"}, {"measurement", "reference"}, {"median_s", reference_time.median_s},
        {"min_s", reference_time.min_s}, {"runs", reference_time.runs},
        {"gflops", flops / reference_time.median_s * 1e-9}, {"peak_bytes", reference_peak},
        {"workspace_bytes", reference_workspace}});

  double max_rel_err = 0;
  for (auto [a, b] : {std::pair{&fused.out, &reference.out}, {&fused.lse, &reference.lse},
                      {&fused.dq, &reference.dq}, {&fused.dk, &reference.dk}, {&fused.dv, &reference.dv}})
    max_rel_err = std::max(max_rel_err, relative_error(a->data(), b->data(), b->size()));

  nlohmann::json summary = bench_summary("attention", fused_time, reference_time, max_rel_err, flops, ceiling_gflops,
                                         gemm.size(), fused_peak, reference_peak);
  summary.update(sizes);
  return summary;
}

}  // namespace trillion
