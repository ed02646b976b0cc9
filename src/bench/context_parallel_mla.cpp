// `trillion bench context-parallel --mixer mla | sparse_mla`: MLA's attention between its
// projections, split over the ranks in the absorbed form, against one rank's expanded form (see
// context_parallel_bench.h).
//
// From the query q [n, H, nope + rope] (its rope part rotated), the latent c [n, r_kv] and kv_a
// [n, r_kv + rope] (its rotated k_rot; the first r_kv columns are the norm's input, which attention
// does not read), through kv_b_proj [H·(nope + v), r_kv] (with --adapter-rank a LoRA adapter on it,
// scaling 2, no dropout) to the attention's output [n, H, v], and back to dq, dc, d k_rot and
// kv_b_proj's gradients:
//   - split: model/mla_absorbed.h's absorbed_operands (W_e, this rank's rows [e | k_rot] gathered into
//     the whole sequences', the absorbed queries), the exchange's gathered attention into the output
//     over the latents (which the model saves), expand_outputs; and absorbed_attention_backward, which
//     gathers the rows again and sums their gradients onto their owners: the functions the model
//     trains with under cp, each pass in its own scratch as there;
//   - one rank over the whole sequences: kv_b_proj's expansion (the forward's scratch), expand_keys
//     (the keys and values the model saves), attention_forward and expanded_attention_backward
//     (model/mla.h), as the model trains without cp.
// sparse_mla attends over the lightning indexer's top-k (drawn inputs; ops/indexer.h): split, its
// keys gathered and each chunk's queries selecting over the whole sequences' keys up to the chunk's
// end (select_split); one rank, indexer_topk over the whole sequences. Both sides hold the inputs,
// the output o_proj reads [n, H, v], lse and the gradients for the whole pass. kv_b_proj's
// gradients are each rank's terms, summed over the ranks before they are compared. The traffic is
// the rows' formula at the absorbed row's width, as the model's plan counts it (model/mla.h
// context_traffic), and the indexer's keys forward.
#include <cmath>
#include <vector>

#include "bench/context_bench_measure.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/mla.h"
#include "model/mla_absorbed.h"
#include "ops/sparse_attention.h"

namespace trillion {
namespace {

// Some tokens' inputs, outputs and gradients.
template <class T>
struct MlaTensors {
  Buffer<T> q, kv_a, latent, d_out;  // [n, H, qk], [n, r_kv + rope], [n, r_kv], [n, H, v]
  Buffer<T> out, lse;                // [n, H, v], [batch, H, seq]
  Buffer<T> dq, d_latent, d_kv_a;    // as q, latent and kv_a
  MlaTensors(int64_t tokens, const MlaDims& dims)
      : q(tokens * dims.q_width()),
        kv_a(tokens * dims.kv_a_out()),
        latent(tokens * dims.kv_lora_rank),
        d_out(tokens * dims.o_width()),
        out(d_out.size()),
        lse(tokens * dims.heads),
        dq(q.size()),
        d_latent(latent.size()),
        d_kv_a(kv_a.size()) {}
  LatentGrads<T> grads() { return {dq.data(), d_latent.data(), d_kv_a.data()}; }
  int64_t bytes() const {
    return int64_t(sizeof(T)) * (2 * q.size() + 2 * kv_a.size() + 2 * latent.size() + 2 * d_out.size() + lse.size());
  }
};

// kv_b_proj's weight [H·(nope + v), r_kv] and its adapter's A [r_a, r_kv] and B [H·(nope + v), r_a].
template <class T>
struct KvB {
  Buffer<T> weight, a, b;
  explicit KvB(const MlaDims& dims)
      : weight(dims.kv_b_out() * dims.kv_lora_rank),
        a(dims.kv_b_adapter_rank * dims.kv_lora_rank),
        b(dims.kv_b_out() * dims.kv_b_adapter_rank) {}
  LinearWeights<T> view(const MlaDims& dims) {
    LinearWeights<T> w{weight.data(), nullptr, {}};
    if (dims.kv_b_adapter_rank > 0) w.lora = {a.data(), b.data(), dims.kv_b_adapter_rank, 2.0};
    return w;
  }
  void zero() {
    weight.zero();
    a.zero();
    b.zero();
  }
  int64_t bytes() const { return int64_t(sizeof(T)) * (weight.size() + a.size() + b.size()); }
};

// What the exchange received from `before` to `after` (its running counts).
ContextTraffic received_between(const ContextTraffic& before, const ContextTraffic& after) {
  return {after.gathered_bytes - before.gathered_bytes, after.reduced_bytes - before.reduced_bytes};
}

template <class T>
RankMeasure run_mla(const ContextParallelBenchOptions& o, const ContextSplit& split, const ProcessGroup& world) {
  const int rank = world.rank();
  const int64_t seq = o.seq_len, batch = o.batch, m = batch * seq;
  MlaDims dims;
  dims.heads = o.heads;
  dims.nope = o.head_dim;
  dims.rope_dim = o.rope_dim;
  dims.v = o.v_dim > 0 ? o.v_dim : o.head_dim;
  dims.kv_lora_rank = o.latent_dim;
  dims.kv_b_adapter_rank = o.adapter_rank;
  dims.scale = 1.0 / std::sqrt(double(dims.qk()));
  const bool sparse = o.mixer == "sparse_mla";
  // The attention's keys per query; the indexer's heads stay 0 (its inputs are drawn here, not
  // projected), and nothing on this path asks whether it is enabled.
  if (sparse) dims.indexer.topk = o.topk;
  const int64_t H = dims.heads, width = dims.absorbed_latent();

  MlaTensors<T> whole(m, dims);
  KvB<T> kv_b(dims), whole_grads(dims);
  const CounterRng rng(o.seed, "bench context-parallel mla");
  uint64_t counter = 0;
  for (Buffer<T>* x : {&whole.q, &whole.kv_a, &whole.latent, &whole.d_out})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(rng.normal(counter++));
  const double fan_in = 1.0 / std::sqrt(double(dims.kv_lora_rank));  // keys and values of about unit size
  for (Buffer<T>* x : {&kv_b.weight, &kv_b.a, &kv_b.b})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(fan_in * rng.normal(counter++));
  IndexerInputs<T> whole_index(sparse ? m : 0, o);
  for (Buffer<T>* x : {&whole_index.q, &whole_index.k, &whole_index.w})
    for (int64_t i = 0; i < x->size(); ++i) (*x)[i] = T(rng.normal(counter++));
  const LinearWeights<T> weights = kv_b.view(dims), whole_grad_view = whole_grads.view(dims);
  const std::vector<int32_t> doc_start = document_starts(batch, seq, o.doc_len);  // [batch, seq]
  const int32_t* whole_docs = o.doc_len > 0 ? doc_start.data() : nullptr;         // [batch, seq] or null
  const AttentionSizes whole_sizes = expanded_sizes(dims, batch, seq, whole_docs);
  const int32_t* whole_selection = sparse ? whole_index.selection.data() : nullptr;  // [m, topk]
  RankMeasure measured;
  const auto reference = [&] {
    Buffer<T> k(m * dims.q_width());  // [m, H, qk] what the model saves
    Buffer<T> v(m * dims.o_width());  // [m, H, v] what the model saves
    {
      Buffer<T> kv(m * dims.kv_b_out());  // [m, H, nope + v] the forward's scratch
      linear(kv.data(), whole.latent.data(), weights, m, dims.kv_lora_rank, dims.kv_b_out(), /*accumulate=*/false);
      expand_keys(k.data(), v.data(), kv.data(), whole.kv_a.data(), m, dims);
    }
    if (sparse) {
      indexer_topk(whole_index.selection.data(), whole_index.q.data(), whole_index.k.data(), whole_index.w.data(),
                   indexer_sizes(o, batch, seq, seq, whole_docs));
      sparse_attention_forward(whole.out.data(), whole.lse.data(), whole.q.data(), k.data(), v.data(), whole_selection,
                               sparse_sizes(whole_sizes, dims.indexer.topk));
    } else {
      attention_forward(whole.out.data(), whole.lse.data(), whole.q.data(), k.data(), v.data(), whole_sizes);
    }
    Arena scratch;
    whole.d_kv_a.zero();
    whole_grads.zero();
    expanded_attention_backward(whole.grads(), whole.d_out.data(), whole.q.data(), whole.latent.data(), k.data(),
                                v.data(), whole.out.data(), whole.lse.data(), whole_selection, weights, whole_grad_view,
                                dims, whole_sizes, scratch);
  };
  measured.one_rank_peak = whole.bytes() + whole_index.bytes() + 2 * kv_b.bytes() + peak_extra_bytes(reference);

  // This rank's tokens.
  ContextParallel context(world, seq);
  const std::vector<int32_t> positions = split.positions(rank);
  const int64_t len = split.local_len(rank), n = batch * len;
  std::vector<int32_t> local_doc_start(batch * len);  // [batch, len] global positions
  take_rows(local_doc_start.data(), doc_start.data(), batch, seq, 1, positions);
  MlaTensors<T> local(n, dims);
  for (const auto& [part, all] : {std::pair{&local.q, &whole.q}, std::pair{&local.kv_a, &whole.kv_a},
                                  std::pair{&local.latent, &whole.latent}, std::pair{&local.d_out, &whole.d_out}})
    take_rows(part->data(), all->data(), batch, seq, all->size() / m, positions);
  IndexerInputs<T> local_index(sparse ? n : 0, o);
  for (const auto& [part, all] : {std::pair{&local_index.q, &whole_index.q}, std::pair{&local_index.k, &whole_index.k},
                                  std::pair{&local_index.w, &whole_index.w}})
    if (sparse) take_rows(part->data(), all->data(), batch, seq, all->size() / m, positions);
  const int32_t* selection = sparse ? local_index.selection.data() : nullptr;  // [n, topk] global positions
  KvB<T> grads(dims);
  const LinearWeights<T> grad_view = grads.view(dims);
  const AttentionSizes sizes = absorbed_sizes(dims, batch, len, seq, o.doc_len > 0 ? local_doc_start.data() : nullptr);
  measure(
      measured, local.bytes() + local_index.bytes() + 2 * kv_b.bytes(), o.runs, world,
      [&](ContextTraffic* forward, ContextTraffic* backward) {
        const ContextTraffic start = context.traffic();
        if (sparse) {
          Buffer<T> index_keys(batch * seq * o.index_dim);  // [batch, seq, d_I]
          context.gather_sequences(index_keys.data(), local_index.k.data(), batch, o.index_dim);
          select_split(local_index, index_keys.data(), o, split, rank, sizes.doc_start);
        }
        Buffer<T> out_latent(n * H * width);  // [n, H, L] what the model saves
        {
          Arena scratch;
          const AbsorbedOperands<T> operands = absorbed_operands(local.q.data(), local.latent.data(), local.kv_a.data(),
                                                                 weights, dims, sizes, context, scratch);
          context.gathered_attention_forward(out_latent.data(), local.lse.data(), operands.q_abs, operands.whole.rows,
                                             operands.whole.latent, selection, dims.indexer.topk, sizes);
          expand_outputs(local.out.data(), out_latent.data(), operands.w_e, width, n, dims);
        }
        const ContextTraffic middle = context.traffic();
        Arena scratch;
        // [H·(nope + v), L] formed again, as the model's backward does
        const T* w_e = absorbed_weight(weights, dims, scratch);
        local.d_kv_a.zero();
        grads.zero();
        absorbed_attention_backward(local.grads(), local.d_out.data(), local.q.data(), local.latent.data(),
                                    local.kv_a.data(), out_latent.data(), local.lse.data(), selection, w_e, weights,
                                    grad_view, dims, sizes, context, scratch);
        if (forward != nullptr) *forward = received_between(start, middle);
        if (backward != nullptr) *backward = received_between(middle, context.traffic());
      },
      reference);
  const std::pair<const Buffer<T>*, const Buffer<T>*> outputs[] = {{&local.out, &whole.out},
                                                                   {&local.dq, &whole.dq},
                                                                   {&local.d_latent, &whole.d_latent},
                                                                   {&local.d_kv_a, &whole.d_kv_a}};
  for (const auto& [part, all] : outputs)
    measured.err = std::max(measured.err, rel_err(*part, *all, batch, seq, all->size() / m, positions));
  measured.err = std::max({measured.err, rel_err(local.lse, whole.lse, batch * H, seq, 1, positions),
                           summed_error(grads.weight, whole_grads.weight, world)});
  if (dims.kv_b_adapter_rank > 0)
    measured.err = std::max(
        {measured.err, summed_error(grads.a, whole_grads.a, world), summed_error(grads.b, whole_grads.b, world)});
  // The rows' traffic as the model's plan counts it (model/mla.h context_traffic).
  measured.plan = ContextSplitPlan(split, rank).gathered_rows(batch, dims.absorbed_row(), sizeof(T));
  if (sparse)  // the indexer's keys
    measured.plan.forward += context_gathered_rows_traffic(split, rank, batch, o.index_dim, sizeof(T)).forward;
  return measured;
}

}  // namespace

RankMeasure run_mla_context(const ContextParallelBenchOptions& o, const ContextSplit& split,
                            const ProcessGroup& world) {
  if (o.rope_dim < 0 || o.latent_dim < 1 || o.adapter_rank < 0)
    fail("bench context-parallel --mixer ", o.mixer, ": --latent-dim must be ≥ 1, --rope-dim and --adapter-rank ≥ 0");
  return o.use_double ? run_mla<double>(o, split, world) : run_mla<float>(o, split, world);
}

}  // namespace trillion
