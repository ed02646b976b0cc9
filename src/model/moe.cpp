// The MoE FFN kind: router, routed experts, shared expert(s), balance-loss gradients. See moe.h.
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/parallel.h"
#include "core/phase_clock.h"
#include "model/family.h"
#include "ops/moe_experts.h"

namespace trillion {

// The router's logits keep float operands under the bf16 precision (as DeepSeek-V3's and
// transformers' routers compute in float32): near-ties between experts decide the top-k, and bf16's
// 8 bits would flip them.
constexpr Operands kRouterOperands = Operands::fp32;

MoeDims MoeDims::from_config(const ModelConfig& config) {
  const Family family = family_of(config.model_type);
  MoeDims dims;
  dims.hidden = config.hidden_size;
  dims.width = config.moe_intermediate_size;
  dims.router.experts = config.num_experts;
  dims.router.top_k = config.num_experts_per_tok;
  dims.router.scoring = family.router;
  dims.router.norm_topk_prob = config.norm_topk_prob;
  dims.router.n_group = config.n_group;
  dims.router.topk_group = config.topk_group;
  dims.router.routed_scaling_factor = config.routed_scaling_factor;
  dims.correction_bias = family.router == RouterScoring::sigmoid;
  dims.capacity_factor = config.moe_capacity_factor;
  dims.init = InitStds::from(config.initializer_range, config.num_hidden_layers);
  dims.shared.hidden = config.hidden_size;
  dims.shared.shared_expert = true;
  dims.shared.init = dims.init;
  if (family.shared_expert_gated) {
    dims.shared.intermediate = config.shared_expert_intermediate_size;
    dims.shared.prefix = "mlp.shared_expert.";
    dims.shared_gated = true;
  } else {
    dims.shared.intermediate = config.n_shared_experts * config.moe_intermediate_size;
    dims.shared.prefix = "mlp.shared_experts.";
  }
  dims.expert_parts = family.expert_parts;
  if (config.lora != nullptr) {
    dims.adapter_rank = config.lora->r;
    for (const auto& [pattern, rank] : config.lora->rank_pattern) dims.adapter_rank = std::max(dims.adapter_rank, rank);
  }
  dims.aux_type = config.router_aux_loss_type;
  dims.aux_coef = config.aux_loss_coef();
  dims.z_coef = config.router_z_loss_coef;
  return dims;
}

int64_t MoeDims::capacity(int64_t tokens) const {
  if (capacity_factor <= 0.0) return 0;
  const double slots = capacity_factor * double(tokens) * double(top_k()) / double(experts());
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots)));
}

std::vector<HfKey> per_expert_keys(int64_t experts, const std::vector<std::string>& parts, int64_t rows, int64_t cols) {
  std::vector<HfKey> keys;
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    for (const std::string& part : parts) {
      keys.push_back({"mlp.experts." + std::to_string(e) + "." + part + ".weight", {rows, cols}, offset});
      offset += rows * cols;
    }
  }
  return keys;
}

double flops_per_token(const MoeDims& dims, int64_t seq) {
  const double D = double(dims.hidden), I = double(dims.width);
  double flops = 6.0 * D * double(dims.experts()) + 18.0 * double(dims.top_k()) * D * I;
  if (dims.shared.intermediate > 0) flops += flops_per_token(dims.shared, seq) + (dims.shared_gated ? 6.0 * D : 0.0);
  return flops;
}

namespace {

// y[n, D] += sigmoid(logit[n]) · out[n, D]
template <class T>
void add_gated(T* y, const T* out, const T* logit, int64_t n, int64_t D) {
  parallel_for(n, D, [&](int64_t t) {
    const T gate = T(1) / (T(1) + std::exp(-logit[t]));
    for (int64_t c = 0; c < D; ++c) y[t * D + c] += gate * out[t * D + c];
  });
}

// The exchanged saved tensors as the expert exchange takes them (model/step.h), each from `index`
// (int32) or `real` (the floating type): the forward's buffers or the backward's tensors.
template <class T, class Index, class Real>
ExchangedRows<T> exchanged_rows(int64_t received, const Index& index, const Real& real) {
  using Tag = ActivationTag;
  return {received,
          index(Tag::ep_row_source),  // [R]
          real(Tag::ep_received),     // [R, D]
          real(Tag::ep_gate_up),      // [R, 2I]
          real(Tag::ep_act),          // [R, I]
          real(Tag::ep_weight)};      // [R]
}

// Under context parallelism the rows are this rank's parts of the sequences, which the sequence-wise
// balance loss sees whole through the group's sums.
std::optional<SplitSequences> split_sequences(const LayerPass& pass) {
  if (pass.context == nullptr) return std::nullopt;
  ContextExchange* context = pass.context;
  return SplitSequences{context->sequence_length(),
                        [context](double* values, int64_t count) { context->sum_over_group(values, count); }};
}

}  // namespace

template <class T>
void ffn_forward(T* y, const T* h, const MoeWeights<T>& w, const MoeDims& dims, const LayerPass& pass, int layer,
                 Arena& scratch) {
  PhaseScope scope(Phase::moe);
  using Tag = ActivationTag;
  const int64_t batch = pass.batch, seq = pass.seq;
  ActivationStore* store = pass.store;
  DecisionLog not_kept;  // decoding: the decision is taken and dropped
  DecisionLog& decisions = pass.keeps_decisions() ? *pass.decisions : not_kept;
  const int64_t n = batch * seq, D = dims.hidden, E = dims.experts(), k = dims.top_k(), I = dims.width;
  SavedExtent extent = SavedExtent::of(pass);  // the routed rows: set once the plan is built
  const SavedWriter router_saves(saved_tensors(dims, extent), store, layer, scratch);
  T* logits = router_saves.out<T>(Tag::router_logits);  // [n, E]
  linear(logits, h, w.router, n, D, E, /*accumulate=*/false, kRouterOperands);
  T* scores = router_saves.out<T>(Tag::router_scores);  // [n, E]
  router_scores_forward(scores, logits, n, dims.router);
  int32_t* index = router_saves.out<int32_t>(Tag::router_index);  // [n, k]
  const int32_t* decided = decisions.decide(DecisionKind::routing, layer, n * k, [&](int32_t* out) {
    router_select(out, scores, w.correction_bias, n, dims.router);
  });
  std::copy(decided, decided + n * k, index);
  T* weight = router_saves.out<T>(Tag::router_weight);  // [n, k]
  router_weights_forward(weight, scores, index, n, dims.router);

  // Capacity applies where routing is recorded (training, evaluation); decoding is dropless, so a
  // prompt gives the same logits in one prefill as token by token.
  MoePlan plan;
  moe_plan_build(plan, index, n, k, E, pass.mode != PassMode::decode ? dims.capacity(n) : 0);
  extent.routed_rows = plan.rows();
  const SavedWriter saves(saved_tensors(dims, extent), store, layer, scratch);
  const MoeExpertDims expert_dims{D, I, E, dims.adapter_rank};
  if (pass.experts != nullptr) {
    // A re-run does not exchange again: it finds the exchanged rows kept, and the owners' activations
    // kept or left to the owners' backward to form again.
    if (pass.mode != PassMode::recompute)
      pass.experts->forward(y, h, w.gate_up.weight, w.down.weight, weight, plan, expert_dims,
                            {w.gate_up.lora, w.down.lora}, [&](int64_t received) {
        extent.received_rows = received;
        const SavedWriter rows(saved_tensors(dims, extent), store, layer, scratch);
        return exchanged_rows<T>(
            received, [&](Tag tag) { return rows.out<int32_t>(tag); }, [&](Tag tag) { return rows.out<T>(tag); });
      });
  } else {
    T* gate_up_out = saves.out<T>(Tag::expert_gate_up);  // [rows, 2I]
    T* act = saves.out<T>(Tag::expert_act);              // [rows, I]
    moe_experts_forward(y, gate_up_out, act, h, w.gate_up.weight, w.down.weight, weight, plan, expert_dims,
                        {w.gate_up.lora, w.down.lora});
  }

  if (dims.shared.intermediate > 0) {
    if (dims.shared_gated) {
      T* out = saves.out<T>(Tag::shared_out);            // [n, D]
      T* logit = saves.out<T>(Tag::shared_gate_logit);   // [n]
      mlp_forward(out, h, n, w.shared, dims.shared, /*accumulate=*/false, store, layer, scratch);
      linear(logit, h, w.shared_gate, n, D, 1, /*accumulate=*/false);
      add_gated(y, out, logit, n, D);
    } else {
      mlp_forward(y, h, n, w.shared, dims.shared, /*accumulate=*/true, store, layer, scratch);
    }
  }

  if (pass.mode == PassMode::decode) return;  // no statistics
  MoeLayerStats stats;
  stats.layer = layer;
  stats.tokens_per_expert.assign(E, 0);
  stats.prob_sums.assign(E, 0.0);
  expert_load(stats.tokens_per_expert.data(), stats.prob_sums.data(), scores, index, n, dims.router);
  stats.rank_tokens_per_expert = stats.tokens_per_expert;  // reduce_statistics sums the first over the ranks
  stats.dropped = plan.total_dropped();
  // A re-run's statistics are discarded, and only some ranks of a context-parallel group re-run.
  if (dims.aux_type == AuxLossType::sequence && dims.aux_coef != 0.0 && pass.mode != PassMode::recompute) {
    const std::optional<SplitSequences> split = split_sequences(pass);
    stats.sequence_aux =
        sequence_aux_loss<T>(nullptr, scores, index, batch, seq, dims.router, 0.0, split ? &*split : nullptr);
  }
  if (dims.z_coef != 0.0) stats.z_loss = router_z_loss<T>(nullptr, logits, n, E, 0.0);
  pass.result->moe.push_back(std::move(stats));
}

template <class T>
void ffn_backward(T* dh, const T* dy, const T* h, const MoeWeights<T>& w, const MoeWeights<T>& grads,
                  const MoeDims& dims, const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch) {
  PhaseScope scope(Phase::moe);
  using Tag = ActivationTag;
  TRILLION_CHECK(pass.balance != nullptr, "MoE backward of layer ", layer, " without its balance gradient");
  const MoeBalanceGrad& balance = *pass.balance;
  const int64_t batch = pass.batch, seq = pass.seq;
  const int64_t n = batch * seq, D = dims.hidden, E = dims.experts(), k = dims.top_k(), I = dims.width;
  SavedExtent extent = SavedExtent::of(pass);
  const SavedReader router_saved(saved_tensors(dims, extent), store, layer);
  const T* logits = router_saved.in<T>(Tag::router_logits);          // [n, E]
  const T* scores = router_saved.in<T>(Tag::router_scores);          // [n, E]
  const int32_t* index = router_saved.in<int32_t>(Tag::router_index);  // [n, k]
  const T* weight = router_saved.in<T>(Tag::router_weight);          // [n, k]
  MoePlan plan;  // rebuilt from the kept decision: the same plan as in forward
  moe_plan_build(plan, index, n, k, E, dims.capacity(n));
  extent.routed_rows = plan.rows();
  const SavedReader saved(saved_tensors(dims, extent), store, layer);
  T* dweight = scratch.alloc<T>(n * k);  // [n, k]
  if (pass.experts != nullptr) {
    extent.received_rows = store.shape(Tag::ep_received, layer)[0];  // R: the other ranks' routing
    const SavedReader rows(saved_tensors(dims, extent), store, layer);
    const ExchangedRows<const T> saved_rows = exchanged_rows<const T>(
        extent.received_rows, [&](Tag tag) { return rows.in<int32_t>(tag); },
        [&](Tag tag) { return rows.in_or_rebuilt<T>(tag); });
    pass.experts->backward(dh, dweight, grads.gate_up.weight, grads.down.weight, dy, w.gate_up.weight,
                           w.down.weight, weight, plan, MoeExpertDims{D, I, E, dims.adapter_rank},
                           {w.gate_up.lora, w.down.lora}, {grads.gate_up.lora, grads.down.lora}, saved_rows);
  } else {
    const T* gate_up_out = saved.in_or_rebuilt<T>(Tag::expert_gate_up);  // [rows, 2I], or null: rebuilt
    const T* act = saved.in_or_rebuilt<T>(Tag::expert_act);              // [rows, I], or null: rebuilt
    moe_experts_backward(dh, dweight, grads.gate_up.weight, grads.down.weight, dy, h, gate_up_out, act,
                         w.gate_up.weight, w.down.weight, weight, plan, MoeExpertDims{D, I, E, dims.adapter_rank},
                         {w.gate_up.lora, w.down.lora}, {grads.gate_up.lora, grads.down.lora});
  }
  T* dscores = scratch.alloc<T>(n * E);  // [n, E], zero-filled
  router_weights_backward(dscores, dweight, scores, index, n, dims.router);
  if (!balance.per_expert.empty()) {
    parallel_for(n, E, [&](int64_t t) {
      for (int64_t e = 0; e < E; ++e) dscores[t * E + e] += static_cast<T>(balance.per_expert[e]);
    });
  }
  if (balance.sequence_scale != 0.0) {
    const std::optional<SplitSequences> split = split_sequences(pass);
    sequence_aux_loss(dscores, scores, index, batch, seq, dims.router, balance.sequence_scale,
                      split ? &*split : nullptr);
  }
  T* dlogits = scratch.alloc<T>(n * E);  // [n, E]
  router_scores_backward(dlogits, dscores, scores, n, dims.router);
  if (balance.z_scale != 0.0) router_z_loss(dlogits, logits, n, E, balance.z_scale);
  linear_grad(dh, grads.router, dlogits, h, w.router, n, D, E, /*accumulate_dx=*/true, kRouterOperands);

  if (dims.shared.intermediate == 0) return;
  if (!dims.shared_gated) {
    mlp_backward(dh, dy, h, n, w.shared, grads.shared, dims.shared, store, layer, scratch);
    return;
  }
  const T* out = saved.in<T>(Tag::shared_out);           // [n, D]
  const T* logit = saved.in<T>(Tag::shared_gate_logit);  // [n]
  T* d_out = scratch.alloc<T>(n * D);  // [n, D] dy · sigmoid(logit)
  T* d_logit = scratch.alloc<T>(n);    // [n]   Σ_c dy · out · σ'(logit)
  parallel_for(n, D, [&](int64_t t) {
    const T gate = T(1) / (T(1) + std::exp(-logit[t]));
    T dot = T(0);
    for (int64_t c = 0; c < D; ++c) {
      d_out[t * D + c] = dy[t * D + c] * gate;
      dot += dy[t * D + c] * out[t * D + c];
    }
    d_logit[t] = dot * gate * (T(1) - gate);
  });
  mlp_backward(dh, d_out, h, n, w.shared, grads.shared, dims.shared, store, layer, scratch);
  linear_grad(dh, grads.shared_gate, d_logit, h, w.shared_gate, n, D, 1, /*accumulate_dx=*/true);
}

// Saved in the forward's order: the router's tensors, the routed experts' rows (rows: the extent's
// routed rows, or their bound), or under the expert exchange the rows this rank's experts received
// (R) with their weights; then the shared expert's.
std::vector<SavedTensor> saved_tensors(const MoeDims& dims, const SavedExtent& extent) {
  using Tag = ActivationTag;
  const int64_t n = extent.tokens(), D = dims.hidden, E = dims.experts(), k = dims.top_k(), I = dims.width;
  const int64_t rows = extent.routed_rows >= 0 ? extent.routed_rows : routed_rows_bound(dims, n);
  std::vector<SavedTensor> list{{Tag::router_logits, {n, E}},   // [n, E]
                                {Tag::router_scores, {n, E}},   // [n, E]
                                {Tag::router_index, {n, k}},    // [n, k] int32
                                {Tag::router_weight, {n, k}}};  // [n, k]
  if (extent.experts_exchanged) {
    const int64_t R = received_rows(extent, rows);
    list.insert(list.end(), {{Tag::ep_row_source, {R}},       // [R] int32
                             {Tag::ep_received, {R, D}},      // [R, D]
                             {Tag::ep_gate_up, {R, 2 * I}},   // [R, 2I]
                             {Tag::ep_act, {R, I}},           // [R, I]
                             {Tag::ep_weight, {R}}});         // [R]
  } else {
    list.insert(list.end(), {{Tag::expert_gate_up, {rows, 2 * I}},  // [rows, 2I]
                             {Tag::expert_act, {rows, I}, true, /*operand=*/true}});  // [rows, I] down's input
  }
  if (dims.shared.intermediate == 0) return list;
  if (dims.shared_gated) list.insert(list.end(), {{Tag::shared_out, {n, D}}, {Tag::shared_gate_logit, {n}}});
  const std::vector<SavedTensor> shared = saved_tensors(dims.shared, n);
  list.insert(list.end(), shared.begin(), shared.end());
  return list;
}

int64_t received_rows(const SavedExtent& extent, int64_t routed_rows) {
  if (extent.received_rows >= 0) return extent.received_rows;
  return static_cast<int64_t>(std::ceil(extent.received_imbalance * double(routed_rows)));
}

// The routed rows R at their bound: N · k dropless; with a capacity each expert keeps at most
// `capacity` slots, so R = Σ_e min(slots_e, capacity) ≤ min(N · k, E · capacity).
int64_t routed_rows_bound(const MoeDims& dims, int64_t tokens) {
  const int64_t k = dims.top_k(), capacity = dims.capacity(tokens);
  return capacity > 0 ? std::min(tokens * k, dims.experts() * capacity) : tokens * k;
}

// Training forward: nothing in scratch (everything it allocates is saved), so the largest of its
// kernels' temporaries: router_select's, the experts' (their rows' outputs [rows, D] among them),
// and the routing statistics'. Backward, at each kernel with temporaries: the experts' after
// dweight [n, k]; the sequence loss's after dscores [n, E]; the z-loss's after dlogits [n, E]; then
// the shared expert's (gated: after d_out [n, D] and d_logit [n]). Under the expert exchange
// (parallel/expert_parallel.h, one chunk: more chunks hold less at once) the experts' are the
// exchange's: in forward the dispatch copy [rows, D] and its weights [rows], the experts' outputs
// [R, D] and unit weights [R] beside the grouped GEMMs' (for R rows), the returned outputs [rows,
// D]; in backward the row gradients both ways ([rows, D] and [R, D] twice) and the dweights both
// ways ([R] and [rows]).
Workspace workspace_bytes(const MoeDims& dims, const StepShape& shape) {
  const int64_t n = shape.tokens(), e = shape.element_bytes, E = dims.experts(), k = dims.top_k(), D = dims.hidden;
  const MoeExpertDims expert_dims{D, dims.width, E, dims.adapter_rank};
  const bool sequence = dims.aux_type == AuxLossType::sequence && dims.aux_coef != 0.0, z = dims.z_coef != 0.0;
  const int64_t sequence_bytes = sequence ? sequence_aux_loss_workspace_bytes(shape.batch, shape.seq, E) : 0;
  const int64_t z_bytes = z ? router_z_loss_workspace_bytes(n) : 0;
  const int64_t rows = routed_rows_bound(dims, n);
  int64_t experts_forward = moe_experts_forward_workspace_bytes(rows, expert_dims, e, shape.threads);
  int64_t experts_backward = moe_experts_backward_workspace_bytes(n, k, expert_dims, e, shape.threads);
  if (shape.experts_exchanged) {
    const int64_t R = received_rows(shape.extent(), rows);
    experts_forward = moe_experts_forward_workspace_bytes(R, expert_dims, e, shape.threads) +
                      (2 * rows * D + rows + R * D + R) * e;
    experts_backward = (2 * rows * D + rows + 2 * R * D + R) * e +
                       moe_experts_backward_workspace_bytes(R, 1, expert_dims, e, shape.threads);
  }
  const int64_t forward = std::max({router_select_workspace_bytes(n, dims.router, e, shape.threads), experts_forward,
                                    expert_load_workspace_bytes(n, E), sequence_bytes, z_bytes});
  const int64_t dweight = Arena::rounded(n * k * e), dscores = Arena::rounded(n * E * e);
  int64_t backward = std::max({dweight + experts_backward, dweight + dscores + sequence_bytes,
                               dweight + 2 * dscores + z_bytes});
  if (dims.shared.intermediate > 0) {
    const int64_t gated = dims.shared_gated ? Arena::rounded(n * dims.hidden * e) + Arena::rounded(n * e) : 0;
    backward = std::max(backward, dweight + 2 * dscores + gated + workspace_bytes(dims.shared, shape).backward);
  }
  return {forward, backward};
}

#define TRILLION_INSTANTIATE(T)                                                                                 \
  template void ffn_forward<T>(T*, const T*, const MoeWeights<T>&, const MoeDims&, const LayerPass&, int, Arena&); \
  template void ffn_backward<T>(T*, const T*, const T*, const MoeWeights<T>&, const MoeWeights<T>&,             \
                                const MoeDims&, const LayerPass&, const ActivationStore&, int, Arena&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
