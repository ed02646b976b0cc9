// `trillion bench sparse-attention` (see sparse_attention_bench.h).
#include "bench/sparse_attention_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/relative_error.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/indexer.h"
#include "ops/ref/indexer_ref.h"
#include "ops/ref/sparse_attention_ref.h"
#include "ops/sparse_attention.h"

namespace trillion {
namespace {

constexpr int64_t kMlaQkDim = 192, kMlaVDim = 128;

// The main attention's head layout of one benchmark line.
struct HeadShape {
  int64_t heads, kv_heads, qk, v;
};

int64_t bytes_of(std::initializer_list<int64_t> counts, int64_t elem_bytes) {
  int64_t total = 0;
  for (int64_t c : counts) total += c * elem_bytes;
  return total;
}

// Seconds of one call of fn.
template <class Fn>
double seconds_of(const Fn& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs the callables in turn (fns[0], fns[1], …, fns[0], …), warmup rounds untimed, then runs timed
// rounds: every callable sees the same machine load. Returns one timing per callable.
std::vector<TimingResult> time_round_robin(const std::vector<std::function<void()>>& fns, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> seconds(fns.size());
  for (int i = 0; i < runs; ++i)
    for (size_t f = 0; f < fns.size(); ++f) seconds[f].push_back(seconds_of(fns[f]));
  std::vector<TimingResult> results;
  for (auto& s : seconds) results.push_back(summarize(s));
  return results;
}

// Random inputs of the main attention and of the indexer, normal(0, 1) but w, which is scaled by
// H_I^−½ (as the caller folds it in), so the weighted ReLU sum stays of order one.
struct BenchInputs {
  SparseAttentionSizes attention;
  IndexerSizes indexer;
  Buffer<float> q, k, v, dout;  // [B, T, H, qk], [B, T, Hkv, qk], [B, T, Hkv, v], [B, T, H, v]
  Buffer<float> iq, ik, w;      // [B, T, H_I, d_I], [B, T, d_I], [B, T, H_I]
  BenchInputs(const SparseAttentionBenchOptions& o, const HeadShape& shape, uint64_t stream)
      : attention{o.batch, o.seq_len, o.seq_len, shape.heads, shape.kv_heads, shape.qk, shape.v, o.topk,
                  1.0 / std::sqrt(double(shape.qk))},
        indexer{o.batch, o.seq_len, o.seq_len, o.index_heads, o.index_head_dim, o.topk,
                1.0 / std::sqrt(double(o.index_head_dim))},
        q(o.batch * o.seq_len * shape.heads * shape.qk),
        k(o.batch * o.seq_len * shape.kv_heads * shape.qk),
        v(o.batch * o.seq_len * shape.kv_heads * shape.v),
        dout(o.batch * o.seq_len * shape.heads * shape.v),
        iq(o.batch * o.seq_len * o.index_heads * o.index_head_dim),
        ik(o.batch * o.seq_len * o.index_head_dim),
        w(o.batch * o.seq_len * o.index_heads) {
    const CounterRng rng(o.seed, stream);
    uint64_t tensor = 0;
    for (Buffer<float>* b : {&q, &k, &v, &dout, &iq, &ik, &w}) {
      const double factor = b == &w ? 1.0 / std::sqrt(double(o.index_heads)) : 1.0;
      ++tensor;
      for (int64_t i = 0; i < b->size(); ++i) (*b)[i] = float(factor * rng.normal((tensor << 40) + i));
    }
  }
  int64_t attention_bytes() const { return bytes_of({q.size(), k.size(), v.size(), dout.size()}, sizeof(float)); }
  int64_t indexer_bytes() const { return bytes_of({iq.size(), ik.size(), w.size()}, sizeof(float)); }
  AttentionSizes dense_sizes() const {
    const SparseAttentionSizes& s = attention;
    return {s.batch, s.q_len, s.kv_len, s.q_heads, s.kv_heads, s.qk_dim, s.scale, s.v_dim};
  }
};

// One path's outputs (all written, =).
struct AttentionOutputs {
  Buffer<float> out, lse, dq, dk, dv;  // [B, T, H, v], [B, H, T], [B, T, H, qk], [B, T, Hkv, qk], [B, T, Hkv, v]
  explicit AttentionOutputs(const BenchInputs& in)
      : out(in.dout.size()), lse(in.attention.batch * in.attention.q_heads * in.attention.q_len),
        dq(in.q.size()), dk(in.k.size()), dv(in.v.size()) {}
  int64_t bytes() const { return bytes_of({out.size(), lse.size(), dq.size(), dk.size(), dv.size()}, sizeof(float)); }
};

// The fused sparse path: indexer top-k, sparse attention forward and backward, seconds per phase.
class SparsePath {
 public:
  explicit SparsePath(const BenchInputs& in)
      : outputs(in), indices(in.attention.batch * in.attention.q_len * in.attention.topk), in_(in) {}
  AttentionOutputs outputs;
  Buffer<int32_t> indices;  // [B, T, topk]

  void run() {
    const BenchInputs& in = in_;
    phases_[0].push_back(seconds_of(
        [&] { indexer_topk(indices.data(), in.iq.data(), in.ik.data(), in.w.data(), in.indexer); }));
    phases_[1].push_back(seconds_of([&] {
      sparse_attention_forward(outputs.out.data(), outputs.lse.data(), in.q.data(), in.k.data(), in.v.data(),
                               indices.data(), in.attention);
    }));
    phases_[2].push_back(seconds_of([&] {
      sparse_attention_backward(outputs.dq.data(), outputs.dk.data(), outputs.dv.data(), in.dout.data(), in.q.data(),
                                in.k.data(), in.v.data(), outputs.out.data(), outputs.lse.data(), indices.data(),
                                in.attention);
    }));
  }
  void clear_phases() {
    for (auto& p : phases_) p.clear();
  }
  // Median seconds of the indexer top-k, the forward and the backward over the runs since clear_phases.
  nlohmann::json phase_fields() const {
    return {{"indexer_topk_s", summarize(phases_[0]).median_s},
            {"forward_s", summarize(phases_[1]).median_s},
            {"backward_s", summarize(phases_[2]).median_s}};
  }
  int64_t bytes() const { return outputs.bytes() + indices.size() * int64_t(sizeof(int32_t)); }

 private:
  const BenchInputs& in_;
  std::vector<double> phases_[3];  // seconds of the indexer top-k, the forward, the backward
};

// The baseline: tiled dense causal attention forward and backward.
void run_dense(const BenchInputs& in, AttentionOutputs& o) {
  const AttentionSizes s = in.dense_sizes();
  attention_forward(o.out.data(), o.lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
  attention_backward(o.dq.data(), o.dk.data(), o.dv.data(), in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                     o.out.data(), o.lse.data(), s);
}

// The plain masked attention over a given selection, forward and backward, in float.
void run_plain_attention(const BenchInputs& in, const int32_t* indices, AttentionOutputs& o) {
  const MatmulPrecisionScope float_operands(MatmulPrecision::fp32);
  sparse_attention_ref_forward(o.out.data(), o.lse.data(), in.q.data(), in.k.data(), in.v.data(), indices,
                               in.attention);
  sparse_attention_ref_backward(o.dq.data(), o.dk.data(), o.dv.data(), in.dout.data(), in.q.data(), in.k.data(),
                                in.v.data(), indices, in.attention);
}

// Rows of a [rows, topk] selection whose key sets differ between a and b.
int64_t mismatched_rows(const Buffer<int32_t>& a, const Buffer<int32_t>& b, int64_t topk) {
  int64_t mismatches = 0;
  std::vector<int32_t> row_a(topk), row_b(topk);  // [topk] each, sorted
  for (int64_t r = 0; r < a.size() / topk; ++r) {
    std::copy(a.data() + r * topk, a.data() + (r + 1) * topk, row_a.begin());
    std::copy(b.data() + r * topk, b.data() + (r + 1) * topk, row_b.begin());
    std::sort(row_a.begin(), row_a.end());
    std::sort(row_b.begin(), row_b.end());
    mismatches += row_a != row_b;
  }
  return mismatches;
}

double max_error(const AttentionOutputs& fused, const AttentionOutputs& reference) {
  double err = 0;
  for (auto [a, b] : {std::pair{&fused.out, &reference.out}, {&fused.lse, &reference.lse},
                      {&fused.dq, &reference.dq}, {&fused.dk, &reference.dk}, {&fused.dv, &reference.dv}})
    err = std::max(err, relative_error(a->data(), b->data(), b->size()));
  return err;
}

nlohmann::json timing_line(const char* measurement, const TimingResult& t) {
  return {{"bench", "sparse-attention"}, {"measurement", measurement}, {"median_s", t.median_s},
          {"min_s", t.min_s},            {"runs", t.runs}};
}

void check_options(const SparseAttentionBenchOptions& o) {
  if (o.seq_len < 1 || o.batch < 1 || o.head_dim < 1 || o.v_dim < 0 || o.index_heads < 1 || o.index_head_dim < 1 ||
      o.topk < 1 || o.mla_heads < 0)
    fail("bench sparse-attention: --seq-len, --batch, --head-dim, --index-heads, --index-head-dim, --topk must be "
         "≥ 1 (--v-dim, --mla-heads ≥ 0)");
  if (o.kv_heads < 1 || o.heads < o.kv_heads) fail("bench sparse-attention: --kv-heads must be ≥ 1 and ≤ --heads");
  if (o.heads % o.kv_heads != 0)
    fail("bench sparse-attention: --heads ", o.heads, " must be a multiple of --kv-heads ", o.kv_heads);
  if (o.runs < 1 || o.baseline_runs < 1) fail("bench sparse-attention: --runs and --baseline-runs must be ≥ 1");
  if (o.gemm_size < 1) fail("bench sparse-attention: --gemm-size must be ≥ 1");
}

}  // namespace

double sparse_attention_bench_sparse_flops(const SparseAttentionBenchOptions& o, int64_t qk_dim, int64_t v_dim,
                                           int64_t heads) {
  double selected = 0;  // N = Σ_t min(topk, t + 1)
  for (int64_t t = 0; t < o.seq_len; ++t) selected += double(std::min(o.topk, t + 1));
  const double visible = double(o.seq_len) * double(o.seq_len + 1) / 2;
  return double(o.batch) * (2.0 * visible * double(o.index_heads * o.index_head_dim) +
                            3.0 * 2.0 * selected * double(heads) * double(qk_dim + v_dim));
}

double sparse_attention_bench_dense_flops(const SparseAttentionBenchOptions& o, int64_t qk_dim, int64_t v_dim,
                                          int64_t heads) {
  const double visible = double(o.seq_len) * double(o.seq_len + 1) / 2;
  return double(o.batch) * 3.0 * 2.0 * visible * double(heads) * double(qk_dim + v_dim);
}

nlohmann::json run_sparse_attention_bench(const SparseAttentionBenchOptions& o,
                                          const std::function<void(const nlohmann::json&)>& emit) {
  check_options(o);
  const MatmulPrecisionScope operands(matmul_precision_from_name(o.precision, "--precision"));
  const HeadShape shape{o.heads, o.kv_heads, o.head_dim, o.v_dim > 0 ? o.v_dim : o.head_dim};
  const BenchInputs in(o, shape, 1);
  const int64_t topk_bytes = in.indexer_bytes() + in.attention_bytes();

  // Sparse, dense and the sgemm ceiling, alternating.
  SparsePath sparse(in);
  AttentionOutputs dense(in);
  const int64_t sparse_workspace = peak_extra_bytes([&] { sparse.run(); });
  const int64_t dense_workspace = peak_extra_bytes([&] { run_dense(in, dense); });
  sparse.clear_phases();
  SgemmProblem gemm(o.gemm_size);
  const std::vector<TimingResult> times =
      time_round_robin({[&] { gemm.run(); }, [&] { sparse.run(); }, [&] { run_dense(in, dense); }}, 0, o.runs);
  const TimingResult &gemm_time = times[0], &sparse_time = times[1], &dense_time = times[2];
  const double ceiling_gflops = gemm.flops() / gemm_time.median_s * 1e-9;
  emit({{"bench", "sparse-attention"}, {"measurement", "sgemm_ceiling"}, {"size", gemm.size()},
        {"gflops", ceiling_gflops}, {"median_s", gemm_time.median_s}, {"min_s", gemm_time.min_s},
        {"runs", gemm_time.runs}});
  const double sparse_flops = sparse_attention_bench_sparse_flops(o, shape.qk, shape.v, shape.heads);
  const double dense_flops = sparse_attention_bench_dense_flops(o, shape.qk, shape.v, shape.heads);
  const int64_t sparse_peak = topk_bytes + sparse.bytes() + sparse_workspace;
  const int64_t dense_peak = in.attention_bytes() + dense.bytes() + dense_workspace;
  nlohmann::json sparse_line = timing_line("sparse", sparse_time);
  sparse_line.update({{"gflops", sparse_flops / sparse_time.median_s * 1e-9}, {"peak_bytes", sparse_peak},
                      {"workspace_bytes", sparse_workspace}});
  sparse_line.update(sparse.phase_fields());
  emit(sparse_line);
  nlohmann::json dense_line = timing_line("dense", dense_time);
  dense_line.update({{"gflops", dense_flops / dense_time.median_s * 1e-9}, {"peak_bytes", dense_peak},
                     {"workspace_bytes", dense_workspace}});
  emit(dense_line);

  // The plain path: its first run gives its results and workspace, then baseline_runs timed runs.
  AttentionOutputs plain(in);
  Buffer<int32_t> plain_indices(sparse.indices.size());  // [B, T, topk]
  auto run_plain = [&] {
    const MatmulPrecisionScope float_operands(MatmulPrecision::fp32);
    indexer_ref_topk(plain_indices.data(), in.iq.data(), in.ik.data(), in.w.data(), in.indexer);
    run_plain_attention(in, plain_indices.data(), plain);
  };
  const int64_t plain_workspace = peak_extra_bytes(run_plain);
  const TimingResult plain_time = time_median(run_plain, 0, o.baseline_runs);
  const int64_t plain_peak = topk_bytes + plain.bytes() + plain_indices.size() * int64_t(sizeof(int32_t)) +
                             plain_workspace;
  nlohmann::json plain_line = timing_line("plain", plain_time);
  plain_line.update({{"gflops", sparse_flops / plain_time.median_s * 1e-9}, {"peak_bytes", plain_peak},
                     {"workspace_bytes", plain_workspace}});
  emit(plain_line);
  const int64_t topk_mismatch_rows = mismatched_rows(sparse.indices, plain_indices, o.topk);
  if (topk_mismatch_rows > 0) run_plain_attention(in, sparse.indices.data(), plain);  // same selection
  const double max_rel_err = max_error(sparse.outputs, plain);

  // Indexer loss, dense warm-up mode (target: the dense attention's lse) and sparse mode (target:
  // the sparse attention's lse), alternating.
  Buffer<float> loss_dq(in.iq.size()), loss_dk(in.ik.size()), loss_dw(in.w.size());  // like iq, ik, w
  const SparseAttentionSizes& as = in.attention;
  auto run_loss = [&](const AttentionOutputs& target_of, IndexerLossMode mode) {
    const IndexerTarget target{in.q.data(), in.k.data(), target_of.lse.data(), as.q_heads, as.kv_heads, as.qk_dim,
                               as.scale};
    indexer_loss(loss_dq.data(), loss_dk.data(), loss_dw.data(), in.iq.data(), in.ik.data(), in.w.data(),
                 sparse.indices.data(), target, mode, 1.0, in.indexer);
  };
  const std::vector<TimingResult> loss_times =
      time_round_robin({[&] { run_loss(dense, IndexerLossMode::kDense); },
                        [&] { run_loss(sparse.outputs, IndexerLossMode::kSparse); }},
                       1, o.runs);
  emit(timing_line("indexer_loss_dense", loss_times[0]));
  emit(timing_line("indexer_loss_sparse", loss_times[1]));

  nlohmann::json summary = bench_summary("sparse-attention", sparse_time, dense_time, max_rel_err, sparse_flops,
                                         ceiling_gflops, gemm.size(), sparse_peak, dense_peak);
  summary.update(sparse.phase_fields());
  summary.update(nlohmann::json{{"dense_flops", dense_flops},
                  {"plain_s", plain_time.median_s},
                  {"plain_runs", plain_time.runs},
                  {"plain_peak_bytes", plain_peak},
                  {"ratio_plain", plain_time.median_s / sparse_time.median_s},
                  {"topk_mismatch_rows", topk_mismatch_rows},
                  {"indexer_loss_dense_s", loss_times[0].median_s},
                  {"indexer_loss_sparse_s", loss_times[1].median_s}});

  // MLA's shapes: qk 192, v 128, one key/value head per query head.
  if (o.mla_heads > 0) {
    const BenchInputs mla_in(o, HeadShape{o.mla_heads, o.mla_heads, kMlaQkDim, kMlaVDim}, 2);
    SparsePath mla_sparse(mla_in);
    AttentionOutputs mla_dense(mla_in);
    const int64_t mla_sparse_workspace = peak_extra_bytes([&] { mla_sparse.run(); });  // the untimed round
    run_dense(mla_in, mla_dense);
    mla_sparse.clear_phases();
    // Under bf16, the sparse path with float operands too (its baseline in this process).
    const bool bf16 = matmul_precision() == MatmulPrecision::bf16;
    SparsePath mla_sparse_fp32(mla_in);
    const auto run_sparse_fp32 = [&] {
      const MatmulPrecisionScope float_operands(MatmulPrecision::fp32);
      mla_sparse_fp32.run();
    };
    std::vector<std::function<void()>> mla_paths = {[&] { mla_sparse.run(); }, [&] { run_dense(mla_in, mla_dense); }};
    if (bf16) {
      run_sparse_fp32();  // untimed, as the others' first runs
      mla_sparse_fp32.clear_phases();
      mla_paths.push_back(run_sparse_fp32);
    }
    const std::vector<TimingResult> mla_times = time_round_robin(mla_paths, 0, o.runs);
    const double mla_flops = sparse_attention_bench_sparse_flops(o, kMlaQkDim, kMlaVDim, o.mla_heads);
    const double mla_speedup = mla_times[1].median_s / mla_times[0].median_s;
    nlohmann::json mla_sparse_line = timing_line("mla_sparse", mla_times[0]);
    mla_sparse_line.update({{"gflops", mla_flops / mla_times[0].median_s * 1e-9},
                            {"workspace_bytes", mla_sparse_workspace}});
    mla_sparse_line.update(mla_sparse.phase_fields());
    emit(mla_sparse_line);
    nlohmann::json mla_dense_line = timing_line("mla_dense", mla_times[1]);
    mla_dense_line.update({{"gflops", sparse_attention_bench_dense_flops(o, kMlaQkDim, kMlaVDim, o.mla_heads) /
                                          mla_times[1].median_s * 1e-9}});
    emit(mla_dense_line);
    if (bf16) {
      nlohmann::json fp32_line = timing_line("mla_sparse_fp32", mla_times[2]);
      fp32_line.update(mla_sparse_fp32.phase_fields());
      emit(fp32_line);
      summary.update(nlohmann::json{{"mla_sparse_fp32_s", mla_times[2].median_s},
                                    {"mla_bf16_gain", mla_times[2].median_s / mla_times[0].median_s}});
    }
    summary.update(nlohmann::json{{"mla_speedup", mla_speedup},
                    {"mla_sparse_s", mla_times[0].median_s},
                    {"mla_dense_s", mla_times[1].median_s},
                    {"mla_heads", o.mla_heads},
                    {"mla_qk_dim", kMlaQkDim},
                    {"mla_v_dim", kMlaVDim}});
  }
  summary.update(nlohmann::json{{"batch", o.batch},
                  {"seq_len", o.seq_len},
                  {"heads", shape.heads},
                  {"kv_heads", shape.kv_heads},
                  {"head_dim", shape.qk},
                  {"v_dim", shape.v},
                  {"index_heads", o.index_heads},
                  {"index_head_dim", o.index_head_dim},
                  {"topk", o.topk},
                  {"precision", o.precision},
                  {"threads", num_threads()}});
  return summary;
}

}  // namespace trillion
