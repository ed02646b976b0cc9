// The mixture-of-experts FFN kind (TorchTitan-style steps: route → dispatch → experts → combine →
// shared experts → sum), on the FFN sublayer's normed input h:
//
//   logits[N, E] = h · W_routerᵀ;  scores = softmax | sigmoid(logits)        (ops/moe_router.h)
//   index[N, k]  = the routing decision, taken once and kept in the DecisionLog (replayed by
//                  gradcheck's perturbed passes and by any recomputation)
//   weight[N, k] = gathered scores (renormalized, scaled as the family does)
//   y += Σ_j weight · expert_{index}(h)                                       (ops/moe_experts.h)
//   y += shared(h)  or  y += sigmoid(h · w_shared_gateᵀ) · shared(h)  (qwen3_next)
//
// Load balancing: the auxiliary loss is formed over layers by the model (pooled) or per layer
// (per_layer, sequence; model/config.h AuxLossType); the router z-loss per layer. This kind
// reports each layer's statistics (tokens per expert, score sums, dropped slots) in the StepResult
// and adds the losses' gradients to its router in backward. Tensors: router `mlp.gate.weight`
// [E, D]; sigmoid routers' buffer `mlp.gate.e_score_correction_bias` [E] (never trained; moved by
// the aux-loss-free update); experts stacked `mlp.experts.gate_up_proj` [E, 2I, D] and
// `mlp.experts.down_proj` [E, D, I], stored per expert as transformers' save_pretrained does.
// Gradient rule: dh accumulates (+=); parameter gradients accumulate (+=).
#pragma once

#include "model/memory_sizes.h"
#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"
#include "model/config.h"
#include "model/mlp.h"
#include "model/param_rows.h"
#include "model/step.h"
#include "ops/moe_router.h"

namespace trillion {

template <class T>
struct MoeWeights;

struct MoeDims {
  template <class T>
  using Weights = MoeWeights<T>;
  int64_t hidden = 0;        // D
  int64_t width = 0;         // I, each expert's intermediate size
  RouterDims router;         // E, k, scoring, groups, renormalization, scaling
  bool correction_bias = false;  // sigmoid routers: e_score_correction_bias used for selection
  double capacity_factor = 0.0;  // 0: dropless
  MlpDims shared;            // shared expert(s); intermediate 0 = none
  int64_t adapter_rank = 0;  // with LoRA, the largest rank its config gives (the experts' adapter workspace)
  bool shared_gated = false; // qwen3_next's sigmoid(shared_expert_gate(h)) gate
  std::vector<std::string> expert_parts;  // checkpoint names of gate, up, down (family.h)
  AuxLossType aux_type = AuxLossType::pooled;
  double aux_coef = 0.0;
  double z_coef = 0.0;
  InitStds init;
  static MoeDims from_config(const ModelConfig& config);
  int64_t experts() const { return router.experts; }
  int64_t top_k() const { return router.top_k; }
  int64_t capacity(int64_t tokens) const;  // ≤ 0: dropless
};

template <class T>
struct MoeWeights {
  LinearWeights<T> router;        // [E, D]
  T* correction_bias = nullptr;   // [E] (buffer; no gradient)
  ExpertWeights<T> gate_up;       // [E, 2I, D] gate rows then up rows of each expert, its LoRA pairs
  ExpertWeights<T> down;          // [E, D, I], its LoRA pair
  MlpWeights<T> shared;           // [Is, D], [Is, D], [D, Is]
  LinearWeights<T> shared_gate;   // [1, D]
};

// The per-expert checkpoint keys of a stacked [E, parts · rows, cols] tensor.
std::vector<HfKey> per_expert_keys(int64_t experts, const std::vector<std::string>& parts, int64_t rows, int64_t cols);

// The MoE's tensors, declared once (model/param_rows.h). Decode cache: none.
template <class T, class Visit>
void visit_params(MoeWeights<T>& w, const MoeDims& dims, Visit&& visit) {
  const int64_t D = dims.hidden, I = dims.width, E = dims.experts();
  visit(w.router.weight, weight_row("mlp.gate.weight", {E, D}, dims.init.std_in));
  if (dims.correction_bias) {
    ParamRow bias = bias_row("mlp.gate.e_score_correction_bias", E);  // 0, as transformers initializes it
    bias.group = ParamGroup::buffer;
    visit(w.correction_bias, bias);
  }
  ParamRow gate_up = linear_row("mlp.experts.gate_up_proj", {E, 2 * I, D}, dims.init.std_in);
  gate_up.group = ParamGroup::expert;
  gate_up.expert_parts = {dims.expert_parts[0], dims.expert_parts[1]};
  gate_up.hf_keys = per_expert_keys(E, gate_up.expert_parts, I, D);
  visit(w.gate_up, gate_up);
  ParamRow down = linear_row("mlp.experts.down_proj", {E, D, I}, dims.init.std_out);
  down.group = ParamGroup::expert;
  down.expert_parts = {dims.expert_parts[2]};
  down.hf_keys = per_expert_keys(E, down.expert_parts, D, I);
  visit(w.down, down);
  if (dims.shared.intermediate > 0) {
    visit_params(w.shared, dims.shared, visit);
    if (dims.shared_gated)
      visit(w.shared_gate, linear_row("mlp.shared_expert_gate.weight", {1, D}, dims.init.std_in));
  }
}

// Training FLOPs per token of the active parameters (forward + backward): router, k experts, shared.
double flops_per_token(const MoeDims& dims, int64_t seq);

// The FFN interface (model/mlp.h). y[n, D] += MoE(h[n, D]) for n = batch · seq tokens; the
// routing decision goes through pass.decisions (decode: taken and not kept, and dropless), the
// layer's statistics and per-layer loss values into pass.result (every mode but decode).
template <class T>
void ffn_forward(T* y, const T* h, const MoeWeights<T>& w, const MoeDims& dims, const LayerPass& pass, int layer,
                 Arena& scratch);

// dh[n, D] += gradient wrt h from dy[n, D] (the gradient wrt the sublayer output); the balance
// losses' gradient comes from pass.balance (required).
template <class T>
void ffn_backward(T* dh, const T* dy, const T* h, const MoeWeights<T>& w, const MoeWeights<T>& grads,
                  const MoeDims& dims, const LayerPass& pass, const ActivationStore& store, int layer, Arena& scratch);

// The tensors its training forward saves (model/saved_tensors.h; the routed rows at their bound
// when the extent does not give them), and the memory plan's most scratch its forward or backward
// holds at once (model/memory_sizes.h).
std::vector<SavedTensor> saved_tensors(const MoeDims& dims, const SavedExtent& extent);
// Its backward reads h also as the router's float operand (model/moe.cpp, kRouterOperands).
constexpr InputUse input_use(const MoeDims&) { return InputUse::values; }
int64_t routed_rows_bound(const MoeDims& dims, int64_t tokens);
// Under the expert exchange: the rows this rank's experts receive (the extent's, or its bound).
int64_t received_rows(const SavedExtent& extent, int64_t routed_rows);
Workspace workspace_bytes(const MoeDims& dims, const StepShape& shape);

}  // namespace trillion
