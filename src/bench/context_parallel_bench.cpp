// Sequence mixers split over a context-parallel group, measured (see context_parallel_bench.h).
#include "bench/context_parallel_bench.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "bench/context_bench_measure.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/rng.h"
#include "ops/indexer.h"
#include "ops/sparse_attention.h"
#include "parallel/context_conv1d.h"
#include "parallel/context_delta_rule.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"

namespace trillion {
namespace {

// The attention tensors of some tokens of every sequence: inputs, outputs and gradients.
template <class T>
struct AttentionTensors {
  Buffer<T> q, k, v, dout, out, lse, dq, dk, dv;  // [batch, len, heads, dim] each; lse [batch, heads, len]
  explicit AttentionTensors(const AttentionSizes& s)
      : q(s.batch * s.q_len * s.q_heads * s.head_dim),
        k(s.batch * s.kv_len * s.kv_heads * s.head_dim),
        v(s.batch * s.kv_len * s.kv_heads * s.value_dim()),
        dout(s.batch * s.q_len * s.q_heads * s.value_dim()),
        out(dout.size()),
        lse(s.batch * s.q_heads * s.q_len),
        dq(q.size()),
        dk(k.size()),
        dv(v.size()) {}
  int64_t bytes() const {
    return int64_t(sizeof(T)) *
           (q.size() + k.size() + v.size() + dout.size() + out.size() + lse.size() + dq.size() + dk.size() + dv.size());
  }
};

// The largest rel err of an attention's outputs and gradients on this rank's rows (`positions`)
// against one rank's over the whole sequences (sizes: theirs); lse [batch, heads, seq] is compared
// as rows of one value: [batch · heads, seq, 1].
template <class T>
double attention_error(const AttentionTensors<T>& local, const AttentionTensors<T>& whole, const AttentionSizes& s,
                       const std::vector<int32_t>& positions) {
  const int64_t batch = s.batch, seq = s.q_len, dv = s.value_dim();
  return std::max({rel_err(local.out, whole.out, batch, seq, s.q_heads * dv, positions),
                   rel_err(local.lse, whole.lse, batch * s.q_heads, seq, 1, positions),
                   rel_err(local.dq, whole.dq, batch, seq, s.q_heads * s.head_dim, positions),
                   rel_err(local.dk, whole.dk, batch, seq, s.kv_heads * s.head_dim, positions),
                   rel_err(local.dv, whole.dv, batch, seq, s.kv_heads * dv, positions)});
}

template <class T>
RankMeasure run_attention(const ContextParallelBenchOptions& o, const ContextSplit& split, const ProcessGroup& world) {
  const int rank = world.rank();
  const int64_t seq = o.seq_len, batch = o.batch;
  AttentionSizes whole_sizes;
  whole_sizes.batch = batch;
  whole_sizes.q_len = whole_sizes.kv_len = seq;
  whole_sizes.q_heads = o.heads;
  whole_sizes.kv_heads = o.kv_heads;
  whole_sizes.head_dim = o.head_dim;
  whole_sizes.v_dim = o.v_dim;
  whole_sizes.scale = 1.0 / std::sqrt(double(o.head_dim));
  const std::vector<int32_t> doc_start = document_starts(batch, seq, o.doc_len);  // [batch, seq]
  if (o.doc_len > 0) whole_sizes.doc_start = doc_start.data();

  const int64_t dv = whole_sizes.value_dim();
  const int64_t q_row = o.heads * o.head_dim, k_row = o.kv_heads * o.head_dim, v_row = o.kv_heads * dv;
  const int64_t out_row = o.heads * dv;
  AttentionTensors<T> whole(whole_sizes);
  const CounterRng rng(o.seed, "bench context-parallel");
  uint64_t counter = 0;
  for (Buffer<T>* x : {&whole.q, &whole.k, &whole.v, &whole.dout})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(rng.normal(counter++));

  RankMeasure m;
  // One rank over the whole sequences: the reference and its peak bytes.
  const auto reference = [&] {
    attention_forward(whole.out.data(), whole.lse.data(), whole.q.data(), whole.k.data(), whole.v.data(), whole_sizes);
    attention_backward(whole.dq.data(), whole.dk.data(), whole.dv.data(), whole.dout.data(), whole.q.data(),
                       whole.k.data(), whole.v.data(), whole.out.data(), whole.lse.data(), whole_sizes);
  };
  m.one_rank_peak = whole.bytes() + peak_extra_bytes(reference);

  // This rank's tokens.
  const std::vector<int32_t> positions = split.positions(rank);
  const int64_t len = split.local_len(rank);
  AttentionSizes local_sizes = whole_sizes;
  local_sizes.q_len = local_sizes.kv_len = len;
  std::vector<int32_t> local_doc_start(batch * len);  // [batch, len] global positions
  take_rows(local_doc_start.data(), doc_start.data(), batch, seq, 1, positions);
  if (o.doc_len > 0) local_sizes.doc_start = local_doc_start.data();
  AttentionTensors<T> local(local_sizes);
  take_rows(local.q.data(), whole.q.data(), batch, seq, q_row, positions);
  take_rows(local.k.data(), whole.k.data(), batch, seq, k_row, positions);
  take_rows(local.v.data(), whole.v.data(), batch, seq, v_row, positions);
  take_rows(local.dout.data(), whole.dout.data(), batch, seq, out_row, positions);

  measure(
      m, local.bytes(), o.runs, world,
      [&](ContextTraffic* forward, ContextTraffic* backward) {
        context_attention_forward(local.out.data(), local.lse.data(), local.q.data(), local.k.data(), local.v.data(),
                                  local_sizes, split, world, forward);
        context_attention_backward(local.dq.data(), local.dk.data(), local.dv.data(), local.dout.data(), local.q.data(),
                                   local.k.data(), local.v.data(), local.out.data(), local.lse.data(), local_sizes,
                                   split, world, backward);
      },
      reference);
  m.err = attention_error(local, whole, whole_sizes, positions);
  m.plan = context_attention_traffic(split, rank, local_sizes, sizeof(T));
  return m;
}

// Sparse attention with its selection (DeepSeek-V3.2's): the lightning indexer's top-k over every
// earlier position, then attention over the selected keys. Split: the indexer's keys gathered and
// each local chunk's queries selecting against the keys up to its end; the keys and values gathered,
// attention per chunk over the selection (context_attention_forward / _backward), and in the backward
// gathered again, their gradients' terms summed onto their owners. One rank: the same over the whole
// sequences. Document masks reach the indexer and the attention, per chunk on the split.
template <class T>
RankMeasure run_sparse_attention(const ContextParallelBenchOptions& o, const ContextSplit& split,
                                 const ProcessGroup& world) {
  const int rank = world.rank();
  const int64_t seq = o.seq_len, batch = o.batch, d = o.head_dim, dv = o.v_dim > 0 ? o.v_dim : d;
  const std::vector<int32_t> doc_start = document_starts(batch, seq, o.doc_len);  // [batch, seq]
  const int32_t* whole_docs = o.doc_len > 0 ? doc_start.data() : nullptr;
  const AttentionSizes whole_sizes{batch, seq, seq, o.heads, o.kv_heads, d, 1.0 / std::sqrt(double(d)), dv, whole_docs};
  AttentionTensors<T> whole(whole_sizes);
  IndexerInputs<T> whole_index(batch * seq, o);
  const CounterRng rng(o.seed, "bench context-parallel sparse");
  uint64_t counter = 0;
  for (Buffer<T>* x : {&whole.q, &whole.k, &whole.v, &whole.dout, &whole_index.q, &whole_index.k, &whole_index.w})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(rng.normal(counter++));
  RankMeasure m;
  const SparseAttentionSizes whole_sparse{batch, seq, seq,    o.heads,           o.kv_heads,
                                          d,     dv,  o.topk, whole_sizes.scale, whole_docs};
  const auto reference = [&] {
    indexer_topk(whole_index.selection.data(), whole_index.q.data(), whole_index.k.data(), whole_index.w.data(),
                 indexer_sizes(o, batch, seq, seq, whole_docs));
    sparse_attention_forward(whole.out.data(), whole.lse.data(), whole.q.data(), whole.k.data(), whole.v.data(),
                             whole_index.selection.data(), whole_sparse);
    sparse_attention_backward(whole.dq.data(), whole.dk.data(), whole.dv.data(), whole.dout.data(), whole.q.data(),
                              whole.k.data(), whole.v.data(), whole.out.data(), whole.lse.data(),
                              whole_index.selection.data(), whole_sparse);
  };
  m.one_rank_peak = whole.bytes() + whole_index.bytes() + peak_extra_bytes(reference);

  // This rank's tokens.
  const std::vector<int32_t> positions = split.positions(rank);
  const int64_t len = split.local_len(rank);
  std::vector<int32_t> local_doc_start(batch * len);  // [batch, len] global positions
  take_rows(local_doc_start.data(), doc_start.data(), batch, seq, 1, positions);
  AttentionSizes local_sizes = whole_sizes;
  local_sizes.q_len = local_sizes.kv_len = len;
  local_sizes.doc_start = o.doc_len > 0 ? local_doc_start.data() : nullptr;
  AttentionTensors<T> local(local_sizes);
  IndexerInputs<T> local_index(batch * len, o);
  const std::pair<Buffer<T>*, Buffer<T>*> inputs[] = {{&local.q, &whole.q},
                                                      {&local.k, &whole.k},
                                                      {&local.v, &whole.v},
                                                      {&local.dout, &whole.dout},
                                                      {&local_index.q, &whole_index.q},
                                                      {&local_index.k, &whole_index.k},
                                                      {&local_index.w, &whole_index.w}};
  for (const auto& [part, all] : inputs)
    take_rows(part->data(), all->data(), batch, seq, all->size() / (batch * seq), positions);
  measure(
      m, local.bytes() + local_index.bytes(), o.runs, world,
      [&](ContextTraffic* forward, ContextTraffic* backward) {
        Buffer<T> index_keys(batch * seq * o.index_dim);  // [batch, seq, d_I]
        context_gather_sequences(index_keys.data(), local_index.k.data(), batch, o.index_dim, split, world, forward);
        select_split(local_index, index_keys.data(), o, split, rank, local_sizes.doc_start);
        context_attention_forward(local.out.data(), local.lse.data(), local.q.data(), local.k.data(), local.v.data(),
                                  local_sizes, split, world, forward, local_index.selection.data(), o.topk);
        context_attention_backward(local.dq.data(), local.dk.data(), local.dv.data(), local.dout.data(), local.q.data(),
                                   local.k.data(), local.v.data(), local.out.data(), local.lse.data(), local_sizes,
                                   split, world, backward, local_index.selection.data(), o.topk);
      },
      reference);
  m.err = attention_error(local, whole, whole_sizes, positions);
  m.plan = context_attention_traffic(split, rank, local_sizes, sizeof(T));
  m.plan.forward +=
      context_gathered_rows_traffic(split, rank, batch, o.index_dim, sizeof(T)).forward;  // the indexer's keys
  return m;
}

// The delta rule's tensors of some tokens: inputs, outputs and gradients, [tokens, row] each.
template <class T>
struct DeltaTensors {
  Buffer<T> q, k, v, g, beta, d_o, o, dq, dk, dv, dg, dbeta;
  DeltaTensors(int64_t tokens, int64_t heads, int64_t kd, int64_t vd, int64_t g_row)
      : q(tokens * heads * kd),
        k(q.size()),
        v(tokens * heads * vd),
        g(tokens * g_row),
        beta(tokens * heads),
        d_o(v.size()),
        o(v.size()),
        dq(q.size()),
        dk(q.size()),
        dv(v.size()),
        dg(g.size()),
        dbeta(beta.size()) {}
  int64_t bytes() const { return int64_t(sizeof(T)) * (4 * q.size() + 4 * v.size() + 2 * g.size() + 2 * beta.size()); }
};

// Gated DeltaNet (per-head decay) or KDA (per key channel): q and k L2-normalized per head (q also
// scaled by K^−½, as the layers hand them over), log-decays in [−0.32, −0.02], β in (0, 1).
template <class T>
RankMeasure run_delta_rule(const ContextParallelBenchOptions& o, DeltaDecay decay, const ContextSplit& split,
                           const ProcessGroup& world) {
  const int rank = world.rank();
  const int64_t seq = o.seq_len, batch = o.batch, H = o.heads, K = o.head_dim, V = o.v_dim > 0 ? o.v_dim : K;
  const int64_t g_row = decay == DeltaDecay::per_key_channel ? H * K : H;
  DeltaTensors<T> whole(batch * seq, H, K, V, g_row);
  const CounterRng rng(o.seed, "bench context-parallel delta rule");
  uint64_t counter = 0;
  for (Buffer<T>* x : {&whole.q, &whole.k, &whole.v, &whole.d_o})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(rng.normal(counter++));
  for (Buffer<T>* x : {&whole.q, &whole.k})
    for (int64_t r = 0; r < batch * seq * H; ++r) {
      T* row = x->data() + r * K;
      T norm = 0;
      for (int64_t i = 0; i < K; ++i) norm += row[i] * row[i];
      const T scale = (x == &whole.q ? T(1 / std::sqrt(double(K))) : T(1)) / std::sqrt(norm);
      for (int64_t i = 0; i < K; ++i) row[i] *= scale;
    }
  for (int64_t i = 0; i < whole.g.size(); ++i) whole.g[i] = T(-0.02 - 0.3 * rng.uniform(counter++));
  for (int64_t i = 0; i < whole.beta.size(); ++i) whole.beta[i] = T(1 / (1 + std::exp(-rng.normal(counter++))));

  // One rank over the whole sequences; with document masks the documents are its packed segments.
  const std::vector<int32_t> doc_start = document_starts(batch, seq, o.doc_len);  // [batch, seq]
  const std::vector<int32_t> cu_seqlens = document_segments(doc_start, seq);  // over the packed tokens
  DeltaRuleSizes whole_sizes{batch, seq, H, K, V, 0, decay};
  if (o.doc_len > 0) whole_sizes = {1, batch * seq, H, K, V, int64_t(cu_seqlens.size()) - 1, decay};
  const int32_t* cu = o.doc_len > 0 ? cu_seqlens.data() : nullptr;
  RankMeasure m;
  const auto reference = [&] {
    delta_rule_chunk_forward(whole.o.data(), static_cast<T*>(nullptr), whole.q.data(), whole.k.data(), whole.v.data(),
                             whole.g.data(), whole.beta.data(), static_cast<const T*>(nullptr), cu, whole_sizes);
    delta_rule_chunk_backward(whole.dq.data(), whole.dk.data(), whole.dv.data(), whole.dg.data(), whole.dbeta.data(),
                              static_cast<T*>(nullptr), whole.d_o.data(), static_cast<const T*>(nullptr),
                              whole.q.data(), whole.k.data(), whole.v.data(), whole.g.data(), whole.beta.data(),
                              static_cast<const T*>(nullptr), cu, whole_sizes);
  };
  m.one_rank_peak = whole.bytes() + peak_extra_bytes(reference);

  // This rank's tokens.
  const std::vector<int32_t> positions = split.positions(rank);
  const int64_t len = split.local_len(rank);
  std::vector<int32_t> local_doc_start(batch * len);  // [batch, len] global positions
  take_rows(local_doc_start.data(), doc_start.data(), batch, seq, 1, positions);
  const int32_t* local_docs = o.doc_len > 0 ? local_doc_start.data() : nullptr;
  DeltaTensors<T> local(batch * len, H, K, V, g_row);
  const std::pair<Buffer<T>*, Buffer<T>*> inputs[] = {{&local.q, &whole.q},       {&local.k, &whole.k},
                                                      {&local.v, &whole.v},       {&local.g, &whole.g},
                                                      {&local.beta, &whole.beta}, {&local.d_o, &whole.d_o}};
  for (const auto& [part, all] : inputs)
    take_rows(part->data(), all->data(), batch, seq, all->size() / (batch * seq), positions);
  const DeltaRuleSizes local_sizes{batch, len, H, K, V, 0, decay};
  Buffer<T> summaries(context_delta_rule_summary_count(split, local_sizes));
  measure(
      m, local.bytes() + summaries.size() * int64_t(sizeof(T)), o.runs, world,
      [&](ContextTraffic* forward, ContextTraffic* backward) {
        context_delta_rule_forward(local.o.data(), summaries.data(), local.q.data(), local.k.data(), local.v.data(),
                                   local.g.data(), local.beta.data(), local_docs, local_sizes, split, world, forward);
        context_delta_rule_backward(local.dq.data(), local.dk.data(), local.dv.data(), local.dg.data(),
                                    local.dbeta.data(), local.d_o.data(), local.q.data(), local.k.data(),
                                    local.v.data(), local.g.data(), local.beta.data(), summaries.data(), local_docs,
                                    local_sizes, split, world, backward);
      },
      reference);
  const std::pair<Buffer<T>*, Buffer<T>*> outputs[] = {{&local.o, &whole.o},   {&local.dq, &whole.dq},
                                                       {&local.dk, &whole.dk}, {&local.dv, &whole.dv},
                                                       {&local.dg, &whole.dg}, {&local.dbeta, &whole.dbeta}};
  for (const auto& [part, all] : outputs)
    m.err = std::max(m.err, rel_err(*part, *all, batch, seq, all->size() / (batch * seq), positions));
  m.plan = context_delta_rule_traffic(split, local_sizes, sizeof(T));
  return m;
}

// The short convolution (ops/conv1d.h) of C = heads · head_dim channels and --conv-width taps;
// dw sums every rank's terms before it is compared.
template <class T>
RankMeasure run_conv(const ContextParallelBenchOptions& o, const ContextSplit& split, const ProcessGroup& world) {
  const int rank = world.rank();
  const int64_t seq = o.seq_len, batch = o.batch, C = o.heads * o.head_dim, W = o.conv_width;
  Buffer<T> x(batch * seq * C), dy(x.size()), y(x.size()), dx(x.size()), w(C * W), dw(w.size());
  const CounterRng rng(o.seed, "bench context-parallel conv");
  uint64_t counter = 0;
  for (Buffer<T>* b : {&x, &dy, &w})
    for (int64_t i = 0; i < b->size(); ++i) (*b)[i] = T(rng.normal(counter++));
  const std::vector<int32_t> doc_start = document_starts(batch, seq, o.doc_len);  // [batch, seq]
  const std::vector<int32_t> cu_seqlens = document_segments(doc_start, seq);     // over the packed tokens
  Conv1dSizes whole_sizes{batch, seq, C, W, 0};
  if (o.doc_len > 0) whole_sizes = {1, batch * seq, C, W, int64_t(cu_seqlens.size()) - 1};
  const int32_t* cu = o.doc_len > 0 ? cu_seqlens.data() : nullptr;
  const auto reference = [&] {
    conv1d_silu_forward(y.data(), x.data(), w.data(), cu, whole_sizes);
    dw.zero();
    conv1d_silu_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), cu, whole_sizes);
  };
  RankMeasure m;
  m.one_rank_peak = int64_t(sizeof(T)) * (4 * x.size() + 2 * w.size()) + peak_extra_bytes(reference);

  const std::vector<int32_t> positions = split.positions(rank);
  const int64_t len = split.local_len(rank);
  std::vector<int32_t> local_doc_start(batch * len);  // [batch, len] global positions
  take_rows(local_doc_start.data(), doc_start.data(), batch, seq, 1, positions);
  const int32_t* local_docs = o.doc_len > 0 ? local_doc_start.data() : nullptr;
  Buffer<T> lx(batch * len * C), ldy(lx.size()), ly(lx.size()), ldx(lx.size()), ldw(w.size());
  take_rows(lx.data(), x.data(), batch, seq, C, positions);
  take_rows(ldy.data(), dy.data(), batch, seq, C, positions);
  const Conv1dSizes local_sizes{batch, len, C, W, 0};
  measure(
      m, int64_t(sizeof(T)) * (4 * lx.size() + 2 * w.size()), o.runs, world,
      [&](ContextTraffic* forward, ContextTraffic* backward) {
        context_conv1d_silu_forward(ly.data(), lx.data(), w.data(), local_docs, local_sizes, split, world, forward);
        ldw.zero();
        context_conv1d_silu_backward(ldx.data(), ldw.data(), ldy.data(), lx.data(), w.data(), local_docs, local_sizes,
                                     split, world, backward);
      },
      reference);
  m.err = std::max({rel_err(ly, y, batch, seq, C, positions), rel_err(ldx, dx, batch, seq, C, positions),
                    summed_error(ldw, dw, world)});
  m.plan = context_conv1d_traffic(split, local_sizes, sizeof(T));
  return m;
}

}  // namespace

// The summary over the ranks: the slowest rank's time per run, the largest error, peak and traffic.
nlohmann::json summarize_ranks(const RankMeasure& m, const ProcessGroup& world) {
  const bool matches = m.plan.forward.gathered_bytes == m.forward.gathered_bytes &&
                       m.plan.forward.reduced_bytes == m.forward.reduced_bytes &&
                       m.plan.backward.gathered_bytes == m.backward.gathered_bytes &&
                       m.plan.backward.reduced_bytes == m.backward.reduced_bytes;
  std::vector<double> mine = {m.err, double(m.peak), double(m.forward.total()), double(m.backward.total()),
                              matches ? 1.0 : 0.0};
  mine.insert(mine.end(), m.seconds.begin(), m.seconds.end());
  const std::vector<double> all = world.all_gather_values<double>(mine);  // [ranks, mine.size()]
  const size_t n = mine.size();
  double err = 0.0, peak = 0.0, forward = 0.0, backward = 0.0;
  bool all_match = true;
  std::vector<double> slowest(m.seconds.size(), 0.0);
  for (int r = 0; r < world.size(); ++r) {
    const double* at = all.data() + r * n;
    err = std::max(err, at[0]);
    peak = std::max(peak, at[1]);
    forward = std::max(forward, at[2]);
    backward = std::max(backward, at[3]);
    all_match = all_match && at[4] == 1.0;
    for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], at[5 + i]);
  }
  const TimingResult timing = summarize(slowest);
  nlohmann::json plain;  // on one rank: the plain kernels, and what the split path costs more
  if (!m.one_rank_seconds.empty()) {
    const double one_rank_s = summarize(m.one_rank_seconds).median_s;
    plain = {{"one_rank_s", one_rank_s}, {"split_overhead", timing.median_s / one_rank_s}};
  }
  return {{"cp", world.size()},
          {"plain", plain},
          {"median_s", timing.median_s},
          {"min_s", timing.min_s},
          {"runs", timing.runs},
          {"max_rel_err", err},
          {"peak_bytes", int64_t(peak)},
          {"one_rank_peak_bytes", m.one_rank_peak},
          {"peak_ratio", peak / double(m.one_rank_peak)},
          {"forward_received_bytes", int64_t(forward)},
          {"backward_received_bytes", int64_t(backward)},
          {"traffic_matches_plan", all_match}};
}

// Documents start where (position + 7 · row) is a multiple of doc_len, so they cross chunks:
// [batch, seq] each token's document start.
std::vector<int32_t> document_starts(int64_t batch, int64_t seq, int64_t doc_len) {
  std::vector<int32_t> doc_start(batch * seq, 0);
  for (int64_t b = 0; b < batch && doc_len > 0; ++b)
    for (int64_t t = 0; t < seq; ++t) doc_start[b * seq + t] = int32_t(std::max<int64_t>(0, t - (t + 7 * b) % doc_len));
  return doc_start;
}

// The documents as packed segments over the batch · seq tokens, [segments + 1] (empty: no masks).
std::vector<int32_t> document_segments(const std::vector<int32_t>& doc_start, int64_t seq) {
  std::vector<int32_t> cu_seqlens;
  for (int64_t t = 0; t < int64_t(doc_start.size()); ++t)
    if (doc_start[t] == t % seq) cu_seqlens.push_back(int32_t(t));
  cu_seqlens.push_back(int32_t(doc_start.size()));
  return cu_seqlens;
}

nlohmann::json run_context_parallel_bench(const ContextParallelBenchOptions& o) {
  const ProcessGroup& world = ProcessGroup::world();
  if (o.batch < 1 || o.heads < 1 || o.kv_heads < 1 || o.head_dim < 1 || o.v_dim < 0 || o.doc_len < 0 || o.runs < 1)
    fail(
        "bench context-parallel: --batch, --heads, --kv-heads, --head-dim and --runs must be ≥ 1, --v-dim and "
        "--doc-len ≥ 0");
  if (o.conv_width < 1) fail("bench context-parallel: --conv-width must be ≥ 1, got ", o.conv_width);
  if ((o.mixer == "sparse" || o.mixer == "sparse_mla") && (o.index_heads < 1 || o.index_dim < 1 || o.topk < 1))
    fail("bench context-parallel --mixer ", o.mixer, ": --index-heads, --index-dim and --topk must be ≥ 1");
  if ((o.mixer == "attention" || o.mixer == "sparse") && o.heads % o.kv_heads != 0)
    fail("bench context-parallel: --heads ", o.heads, " must be a multiple of --kv-heads ", o.kv_heads);
  const ContextSplit split(o.seq_len, world.size());
  RankMeasure m;
  if (o.mixer == "attention") {
    m = o.use_double ? run_attention<double>(o, split, world) : run_attention<float>(o, split, world);
  } else if (o.mixer == "sparse") {
    m = o.use_double ? run_sparse_attention<double>(o, split, world) : run_sparse_attention<float>(o, split, world);
  } else if (o.mixer == "conv") {
    m = o.use_double ? run_conv<double>(o, split, world) : run_conv<float>(o, split, world);
  } else if (o.mixer == "mla" || o.mixer == "sparse_mla") {
    m = run_mla_context(o, split, world);
  } else if (o.mixer == "gated_deltanet" || o.mixer == "kda") {
    const DeltaDecay decay = o.mixer == "kda" ? DeltaDecay::per_key_channel : DeltaDecay::per_head;
    m = o.use_double ? run_delta_rule<double>(o, decay, split, world) : run_delta_rule<float>(o, decay, split, world);
  } else {
    fail("bench context-parallel: --mixer ", o.mixer,
         " must be attention, sparse, mla, sparse_mla, gated_deltanet, kda or conv");
  }
  nlohmann::json summary = summarize_ranks(m, world);
  summary.update({{"bench", "context-parallel"},
                  {"mixer", o.mixer},
                  {"dtype", o.use_double ? "double" : "float"},
                  {"seq_len", o.seq_len},
                  {"batch", o.batch},
                  {"heads", o.heads},
                  {"kv_heads", o.kv_heads},
                  {"head_dim", o.head_dim},
                  {"v_dim", o.v_dim > 0 ? o.v_dim : o.head_dim},
                  {"doc_len", o.doc_len},
                  {"conv_width", o.conv_width}});
  if (o.mixer == "sparse" || o.mixer == "sparse_mla")
    summary.update({{"index_heads", o.index_heads}, {"index_dim", o.index_dim}, {"topk", o.topk}});
  if (o.mixer == "mla" || o.mixer == "sparse_mla")
    summary.update({{"rope_dim", o.rope_dim}, {"latent_dim", o.latent_dim}, {"adapter_rank", o.adapter_rank}});
  return summary;
}

}  // namespace trillion
