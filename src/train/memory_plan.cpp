// The shape-only memory plan of a training step and the budget's choice of policies (see the header).
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "core/bf16.h"
#include "core/error.h"
#include "memory/save_policies.h"
#include "memory/swap_engine.h"
#include "model/decoder_layer.h"
#include "model/memory_sizes.h"
#include "model/model.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "parallel/context_parallel.h"
#include "parallel/mesh.h"
#include "parallel/shard_layout.h"

namespace trillion {
namespace {

// One decoder layer's saved bytes as the store will hold them under the policy, per part (indexed
// by TagSublayer: mixer, ffn).
struct LayerBytes {
  int64_t all[2] = {};      // every saved tensor, as counted while resident
  int64_t kept[2] = {};     // resident from its forward to its backward
  int64_t swapped[2] = {};  // written to the slow tier
  int64_t paged_ffn = 0;    // freed when the FFN part of the backward ends
  int64_t small = 0;        // entries below the paged size: the store frees them when the step ends
  int64_t first = 0;        // swapped, read back for the backward's first part (FFN + checkpoint)
  int64_t dropped_ffn = 0;  // the FFN's dropped for recompute: refilled only when the FFN is re-run, after the mixer
  int64_t rebuilt = 0;      // dropped and never refilled: their backward forms them again
  int64_t rebuilt_float_copies = 0;  // the float copies they would have had in the backward
  int64_t throwaway = 0;    // copies handed out for kept tensors while its sublayers are re-run
  int64_t throwaway_mixer = 0;  // of which the mixer's
  int64_t file = 0;         // the swapped tensors' bytes in the swap file
  int64_t exchanged = 0;    // the expert exchange's rows (tags of kind exchanged), as counted
  int64_t float_copies[2] = {};  // bf16 operands' float copies while their part's forward or backward runs
  int64_t float_copies_dropped = 0;  // … of the dropped ones, while recompute refills them
  LayerWorkspace workspace;  // each part's
  bool rerun_mixer = false, rerun_ffn = false;  // the sublayers recompute re-runs before the FFN's backward
  int64_t total() const { return all[0] + all[1]; }
  int64_t total_kept() const { return kept[0] + kept[1]; }
};

// As the store counts them: paged entries by their bytes, small ones by the arena's rounding. Swap
// tags of the last layer stay resident (ActivationStore::end_forward, backward_next): `swaps` false.
LayerBytes layer_bytes(const DecoderLayerDims& dims, const StepShape& step, const std::set<ActivationTag>& recompute,
                       const std::set<ActivationTag>& swap, bool swaps, int64_t min_paged, bool swap_bf16) {
  LayerBytes b;
  const std::vector<SavedSize> sizes = dims.saved_sizes(step);
  bool rerun_mixer = false, rerun_ffn = false;
  for (const SavedSize& s : sizes) {  // which sublayers Model::recompute re-runs
    if (!ActivationStore::is_paged(s.bytes, min_paged) || !recompute.count(s.tag)) continue;
    rerun_mixer = rerun_mixer || recompute_reruns(s.tag, TagSublayer::mixer);
    rerun_ffn = rerun_ffn || recompute_reruns(s.tag, TagSublayer::ffn);
  }
  for (const SavedSize& s : sizes) {
    const bool paged = ActivationStore::is_paged(s.bytes, min_paged);
    const bool ffn = tag_sublayer(s.tag) == TagSublayer::ffn;
    const int64_t counted = ActivationStore::held_bytes(s.bytes, min_paged);
    b.all[ffn] += counted;
    b.float_copies[ffn] += s.float_copy;
    if (tag_kind(s.tag) == TagKind::exchanged) b.exchanged += counted;
    if (paged && ffn) b.paged_ffn += counted;
    if (!paged) b.small += counted;
    if (paged && recompute.count(s.tag)) {
      // A tag its backward rebuilds stays dropped unless its sublayer is re-run for another tag and
      // saves it again (never the exchanged rows: a re-run does not exchange).
      if (rebuilt_by_its_backward(s.tag) && (!rerun_ffn || tag_kind(s.tag) == TagKind::exchanged)) {
        b.rebuilt += counted;
        b.rebuilt_float_copies += s.float_copy;
        continue;
      }
      if (ffn) b.dropped_ffn += counted;  // refilled in place by recompute
      b.float_copies_dropped += s.float_copy;
      continue;
    }
    // A re-run sublayer saves its kept tensors again into throwaway copies, but for the exchanged
    // rows: it does not exchange again (model/moe.cpp).
    if ((ffn ? rerun_ffn : rerun_mixer) && tag_kind(s.tag) != TagKind::exchanged) {
      const int64_t written = Arena::rounded(s.float_copy > 0 ? s.float_copy : s.bytes);  // floats, always
      b.throwaway += written;
      if (!ffn) b.throwaway_mixer += written;
    }
    if (paged && swaps && swap.count(s.tag)) {
      b.swapped[ffn] += counted;
      if (ffn || (rerun_mixer && s.tag == ActivationTag::attn_input)) b.first += counted;
      const bool float32 = step.element_bytes == 4 && tag_element(s.tag) == TagElement::real && s.float_copy == 0;
      b.file += SwapEngine::file_bytes(s.bytes, swap_bf16 && float32);
    } else {
      b.kept[ffn] += counted;
    }
  }
  b.workspace = dims.workspace_bytes(step);
  b.rerun_mixer = rerun_mixer;
  b.rerun_ffn = rerun_ffn;
  return b;
}

int64_t sum_kept(const std::vector<LayerBytes>& layers, size_t below) {
  int64_t total = 0;
  for (size_t j = 0; j < below; ++j) total += layers[j].total_kept();
  return total;
}

// FSDP's units in use at the events of a step (parallel/fsdp.h's hooks, in model.h's unit order),
// in bytes of the ranges this rank gathers: the parameters gathered (the unit in use, the one
// prefetched after it, and tied embeddings' unit 0 from the embedding to the end; under bf16 in
// the runs FSDP gathers them in, ShardLayout::Run) and the gradients written and not yet
// reduce-scattered. One rank: nothing is gathered or released.
class UnitsInUse {
 public:
  // table and layout: the model's parameter table and, on several ranks, this rank's shards of it.
  UnitsInUse(const ModelConfig& config, const StepMemoryShape& shape, bool head_gradients_in_forward,
             const ParamTable& table, const std::optional<ShardLayout>& layout)
      : layers_(config.num_hidden_layers),
        head_(head_unit(config)),
        sharded_(shape.ranks > 1),
        accumulating_(shape.grad_accum > 1),
        head_gradients_in_forward_(head_gradients_in_forward),
        gathered_(config.num_hidden_layers + 2, 0),
        written_(config.num_hidden_layers + 2, 0) {
    if (!sharded_) return;
    for (const ShardLayout::Unit& piece : layout->units()) {
      if (!piece.held) continue;
      if (!piece.frozen) written_[piece.table_unit] += piece.count * shape.element_bytes;
      for (const ShardLayout::Run& run : layout->gather_runs(table, piece, shape.bf16_gathers()))
        gathered_[piece.table_unit] += run.held_bytes(shape.element_bytes);
    }
  }
  int64_t embedding_forward() const { return bytes({0, 1}, {}); }
  int64_t layer_forward(int l) const {  // unit 1 + l, the next one prefetched
    const int next = l + 1 < layers_ ? 2 + l : (head_ != 0 ? head_ : -1);
    return bytes({1 + l, next, tied() ? 0 : -1}, {});
  }
  int64_t loss() const { return bytes({head_}, {head_gradients_in_forward_ ? head_ : -1}); }
  int64_t loss_backward() const { return bytes({head_, layers_}, {head_}); }
  int64_t layer_backward(int l) const {  // unit 1 + l, the one below prefetched
    const int next = l > 0 ? l : (tied() ? -1 : 0);
    return bytes({1 + l, next, tied() ? 0 : -1}, {1 + l, tied() ? 0 : -1});
  }
  int64_t embedding_backward() const { return bytes({0}, {0}); }

 private:
  bool tied() const { return head_ == 0; }
  // Gathered parameters of `params` and written gradients of `grads` (-1: none; each unit once).
  int64_t bytes(std::set<int> params, std::set<int> grads) const {
    if (!sharded_) return 0;
    if (accumulating_) {  // the earlier micro-batches wrote every unit's gradients
      grads.clear();
      for (size_t unit = 0; unit < written_.size(); ++unit) grads.insert(static_cast<int>(unit));
    }
    int64_t total = 0;
    for (const int unit : params) total += unit >= 0 ? gathered_[unit] : 0;
    for (const int unit : grads) total += unit >= 0 ? written_[unit] : 0;
    return total;
  }
  int layers_, head_;
  bool sharded_, accumulating_, head_gradients_in_forward_;
  std::vector<int64_t> gathered_;  // [table units] bytes of this rank's held ranges gathered
  std::vector<int64_t> written_;   // [table units] bytes of their gradients
};

}  // namespace

LayerStep::LayerStep(const StepMemoryShape& shape) {
  if (shape.cp > 1)
    context_.emplace(ContextSplit(shape.seq, shape.cp), ParallelMesh::cp_rank(shape.rank, shape.ep, shape.cp));
  step_.batch = shape.batch;
  step_.seq = context_ ? context_->split().local_len(context_->rank()) : shape.seq;  // tokens per row
  step_.context = context_ ? &*context_ : nullptr;
  step_.element_bytes = shape.element_bytes;
  step_.threads = shape.threads;
  step_.indexer = shape.indexer;
  step_.experts_exchanged = shape.ep > 1;
  step_.expert_imbalance = shape.expert_imbalance;
  step_.bf16_operands = shape.bf16_products;
}

std::string MemoryPolicy::name() const {
  if (recompute == "none" && swap == "none") return "keep-all";
  std::string text;
  if (recompute != "none") text = "recompute " + recompute;
  if (swap != "none") text += (text.empty() ? "" : " + ") + std::string("swap ") + swap;
  return text;
}

MemoryPlan plan_memory(const ModelConfig& config, const StepMemoryShape& shape, const MemoryPolicy& policy) {
  return plan_memory(config, param_table_of(config), shape, policy);
}

MemoryPlan plan_memory(const ModelConfig& config, const ParamTable& table, const StepMemoryShape& shape,
                       const MemoryPolicy& policy) {
  check_disjoint_policies(policy.recompute, policy.swap);
  const std::vector<ActivationTag> recompute_list = recompute_tags(policy.recompute);
  const std::vector<ActivationTag> swap_list = swap_tags(policy.swap);
  const std::set<ActivationTag> recompute(recompute_list.begin(), recompute_list.end());
  const std::set<ActivationTag> swap(swap_list.begin(), swap_list.end());
  const ParamCounts counts = count_parameters(config, table);
  const LayerStep layer_step(shape);
  StepShape step = layer_step.shape();
  const int64_t e = shape.element_bytes, n = step.tokens(), D = config.hidden_size, V = config.vocab_size;
  const bool has_sparse = config.sparse_layers() > 0;
  if (!has_sparse) step.indexer.coef = 0.0;

  MemoryPlan plan;
  plan.policy = policy;
  plan.ranks = shape.ranks;
  plan.rank = shape.rank;
  // The rank's shards of the trainable and of the frozen elements (one rank: all of them, at their
  // flat offsets).
  const std::optional<ShardLayout> layout =
      shape.ranks > 1 ? std::optional<ShardLayout>(std::in_place, table, shape.rank, shape.ranks, shape.ep)
                      : std::nullopt;
  const int64_t shard = layout ? layout->shard_size() : counts.trainable_storage;
  // The frozen shard as FSDP holds it: under bf16 gathers its products-only parts in bf16 alone.
  std::optional<ShardLayout::FrozenParts> frozen_parts;
  if (layout) frozen_parts.emplace(layout->frozen_parts(table, shape.bf16_gathers()));
  const int64_t frozen_shard_bytes =
      frozen_parts ? frozen_parts->bytes(e) : (counts.sharded_storage - counts.trainable_storage) * e;
  const int64_t unsharded = counts.storage - counts.sharded_storage;  // buffers: every rank keeps them whole
  plan.parameters = (shard + unsharded) * e + frozen_shard_bytes;
  if (shape.ranks == 1 && shape.bf16_products && e == 4) plan.parameters += counts.storage * int64_t(sizeof(bf16));
  int64_t released = 0;  // LoRA's frozen base in bf16 only: its linear weights' float pages
  if (keeps_bf16_only_base(config, shape.ranks, e, shape.bf16_products))
    for (const auto& [begin, end] : bf16_only_base_ranges(table)) released += (end - begin) * e;
  plan.parameters -= released;
  plan.gradients = shard * e;
  plan.optimizer_state = 2 * shard * e;  // AdamW's two moments
  // Every rank initializes or loads the whole parameters, then takes its shard (parallel/fsdp.h).
  plan.start_up = counts.storage * e + (shape.ranks > 1 ? plan.parameters - unsharded * e + plan.gradients : 0) +
                  plan.optimizer_state;
  if (released > 0)  // the bf16 copy made beside the whole float parameters, before their release
    plan.start_up = plan.parameters + released + plan.gradients + plan.optimizer_state;
  std::vector<LayerBytes> layers;
  bool any_rerun = false;
  double rebuilt_row_flops = 0.0;  // summed over the MoE layers
  int moe_layers = 0;
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const bool swaps = l + 1 < config.num_hidden_layers;
    const DecoderLayerDims dims = DecoderLayerDims::from_config(config, l);
    layers.push_back(layer_bytes(dims, step, recompute, swap, swaps, shape.policy_min_bytes, shape.swap_bf16));
    plan.activations_saved += layers.back().total();
    const std::string kind =
        std::string(layer_type_name(config.layer_types[l])) + (config.is_moe_layer(l) ? " + moe" : " + dense mlp");
    auto of_kind = std::find_if(plan.activations_by_kind.begin(), plan.activations_by_kind.end(),
                                [&](const MemoryPlan::KindActivations& k) { return k.kind == kind; });
    if (of_kind == plan.activations_by_kind.end())
      of_kind = plan.activations_by_kind.insert(of_kind, MemoryPlan::KindActivations{kind});
    of_kind->layers += 1;
    of_kind->saved += layers.back().total();
    of_kind->kept += layers.back().total_kept();
    of_kind->exchanged += layers.back().exchanged;
    plan.peak_slow += layers.back().file;
    any_rerun = any_rerun || layers.back().rerun_mixer || layers.back().rerun_ffn;
    plan.reruns_mixers = plan.reruns_mixers || layers.back().rerun_mixer;
    // A re-run sublayer's forward: a third of its training FLOPs (forward 1, backward 2); a re-run
    // MoE sublayer does not exchange, so with ep its routed experts do not run again. The experts'
    // backward forms a dropped gate/up output again: 2 · 2I · D per row its experts run.
    const MoeDims* moe = std::get_if<MoeDims>(&dims.ffn);
    const double routed = moe != nullptr && shape.ep > 1 ? 18.0 * double(moe->top_k() * moe->hidden * moe->width) : 0.0;
    plan.rerun_flops_per_token += (layers.back().rerun_mixer ? dims.mixer_flops_per_token(shape.seq) / 3.0 : 0.0) +
                                  (layers.back().rerun_ffn ? (dims.ffn_flops_per_token(shape.seq) - routed) / 3.0 : 0.0);
    if (moe != nullptr && layers.back().rebuilt > 0) rebuilt_row_flops += 4.0 * double(moe->hidden * moe->width);
    moe_layers += moe != nullptr ? 1 : 0;
  }
  plan.rebuild_flops_per_routed_row = moe_layers > 0 ? rebuilt_row_flops / moe_layers : 0.0;
  // hidden, its gradient, positions; the recompute copy; the sampler; the bf16 swap's staging buffer.
  plan.model_buffers = 2 * n * D * e + n * 4 + (any_rerun ? n * D * e : 0) + shape.sampler_windows * 8 +
                       (shape.swap_bf16 && plan.peak_slow > 0 ? SwapEngine::kStagingBytes : 0);
  // A whole checkpoint: every rank gathers the parameters but the buffers (Fsdp::gather_everything) and
  // both moments (Optimizer::save), or a LoRA run's rank 0 the adapter file's reordered tensors
  // (Model::save_adapter) before them, beside its shards and buffers; the step's activations are gone.
  if (shape.ranks > 1 && shape.whole_checkpoints) {
    // The checkpoint's adapter as trained, then OUT/adapter in its layout.
    const int64_t adapter =
        config.lora == nullptr ? 0
                               : std::max(adapter_file_staging_bytes(config, ExpertLayout::as_trained, e),
                                          adapter_file_staging_bytes(config, shape.adapter_layout, e));
    // The frozen shard widened to float for its gather, when held partly in bf16, before the moments.
    const int64_t widened = frozen_parts->bf16_elements == 0 ? 0 : layout->frozen_shard_size() * e;
    plan.checkpoint_save = plan.parameters + plan.gradients + plan.optimizer_state + plan.model_buffers +
                           counts.sharded_storage * e + std::max({widened, 2 * counts.trainable_storage * e, adapter});
  }

  // The head's saved tensors.
  const bool in_forward = shape.loss == LossGradients::in_forward;
  int64_t head = 0, head_float_copies = 0;
  int64_t small_after = 0;  // the small entries of the head and the layers whose backward is done
  for (const SavedSize& s : saved_sizes(head_saved_tensors(n, D, in_forward), e, step.bf16_operands)) {
    const int64_t held = ActivationStore::held_bytes(s.bytes, shape.policy_min_bytes);
    head += held;
    head_float_copies += s.float_copy;
    small_after += ActivationStore::is_paged(s.bytes, shape.policy_min_bytes) ? 0 : held;
  }
  plan.activations_saved += head;
  // With the loss's gradients formed in the forward, the final norm's output is not kept: it is the
  // scratch's, beside the loss's tiles.
  const int64_t loss_forward =
      in_forward ? Arena::rounded(n * D * e) + forward_backward_workspace_bytes(n, V, e, shape.bf16_products)
                 : forward_then_backward_workspace_bytes(n, D, V, e, shape.threads);
  // The head's backward: (recompute: dh [n, D] in the scratch and the loss's tiles again), then the
  // final norm's backward.
  const int64_t norm_backward = rmsnorm_backward_workspace_bytes(n, D, true);
  const int64_t loss_backward =
      in_forward ? norm_backward : Arena::rounded(n * D * e) + std::max(loss_forward, norm_backward);
  plan.loss_workspace = std::max(loss_forward, loss_backward);

  const int L = static_cast<int>(layers.size());
  const UnitsInUse units(config, shape, in_forward, table, layout);
  const auto consider = [&](int64_t activations, int64_t workspace, int64_t gathered, const std::string& where) {
    if (activations + workspace + gathered >
            plan.activations_at_peak + plan.workspace_at_peak + plan.gathered_at_peak ||
        plan.peak_at.empty()) {
      plan.activations_at_peak = activations;
      plan.workspace_at_peak = workspace;
      plan.gathered_at_peak = gathered;
      plan.peak_at = where;
    }
  };
  consider(0, 0, units.embedding_forward(), "the embedding's forward");
  // The forward of each part, with the writes of the part before still in flight (the writer at
  // most one part behind); the last layer's swap tags stay resident, so none are in flight at the head.
  for (int l = 0; l < L; ++l) {
    const std::string where = "forward of layer " + std::to_string(l);
    const int64_t writing = l > 0 ? layers[l - 1].swapped[1] : 0;
    const LayerBytes& b = layers[l];
    consider(sum_kept(layers, l) + writing + b.all[0] + b.float_copies[0], b.workspace.mixer_forward,
             units.layer_forward(l), where + ", mixer");
    consider(sum_kept(layers, l) + b.kept[0] + b.swapped[0] + b.all[1] + b.float_copies[1], b.workspace.ffn_forward,
             units.layer_forward(l), where + ", FFN");
  }
  consider(sum_kept(layers, L) + head + head_float_copies, loss_forward, units.loss(), "the loss");
  consider(sum_kept(layers, L) + head + head_float_copies, loss_backward, units.loss_backward(), "the loss's backward");
  // A layer's backward: its FFN part with the whole layer resident (its mixer's entries prefetched),
  // then its mixer part with the FFN's entries freed and the layer below's first part prefetched.
  for (int l = L - 1; l >= 0; --l) {
    const std::string where = "backward of layer " + std::to_string(l);
    const LayerBytes& b = layers[l];
    const int64_t resident = small_after + sum_kept(layers, l) + b.total() - b.rebuilt;
    if (b.rerun_mixer)
      consider(resident - b.dropped_ffn + b.throwaway_mixer + b.float_copies_dropped, b.workspace.mixer_forward,
               units.layer_backward(l), where + ", the mixer's recompute");
    if (b.rerun_ffn)
      consider(resident + b.throwaway + b.float_copies_dropped, b.workspace.ffn_forward, units.layer_backward(l),
               where + ", the FFN's recompute");
    consider(resident + b.throwaway + b.float_copies[1] - b.rebuilt_float_copies, b.workspace.ffn_backward,
             units.layer_backward(l), where + ", FFN");
    const int64_t prefetch = l > 0 ? layers[l - 1].first : 0;
    consider(small_after + sum_kept(layers, l) + b.total() - b.paged_ffn + prefetch + b.float_copies[0],
             b.workspace.mixer_backward, units.layer_backward(l), where + ", mixer");
    small_after += b.small;
  }
  consider(small_after, embedding_backward_workspace_bytes(n, V), units.embedding_backward(),
           "the embedding's backward");
  plan.peak_fast = plan.parameters + plan.gradients + plan.optimizer_state + plan.model_buffers +
                   plan.activations_at_peak + plan.workspace_at_peak + plan.gathered_at_peak;
  return plan;
}

bool keeps_bf16_only_base(const ModelConfig& config, int ranks, int64_t element_bytes, bool bf16_products) {
  return config.lora != nullptr && ranks == 1 && element_bytes == 4 && bf16_products;
}

nlohmann::json MemoryPlan::to_json() const {
  return {{"policy", {{"recompute", policy.recompute}, {"swap", policy.swap}, {"name", policy.name()}}},
          {"rank", rank},
          {"ranks", ranks},
          {"fast", {{"parameters", parameters},
                    {"gradients", gradients},
                    {"optimizer_state", optimizer_state},
                    {"model_buffers", model_buffers},
                    {"activations_at_peak", activations_at_peak},
                    {"workspace_at_peak", workspace_at_peak},
                    {"gathered_at_peak", gathered_at_peak},
                    {"peak", peak_fast},
                    {"peak_at", peak_at},
                    {"start_up", start_up},
                    {"checkpoint_save", checkpoint_save}}},
          {"slow", {{"peak", peak_slow}}},
          {"activations_saved", activations_saved},
          {"loss_workspace", loss_workspace},
          {"activations_by_kind", [&] {
             nlohmann::json kinds = nlohmann::json::array();
             for (const KindActivations& k : activations_by_kind)
               kinds.push_back({{"kind", k.kind}, {"layers", k.layers}, {"saved", k.saved}, {"kept", k.kept},
                                {"exchanged", k.exchanged}});
             return kinds;
           }()}};
}

std::string MemoryPlan::describe() const {
  const auto mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f MiB", double(bytes) / double(1 << 20));
    return std::string(text);
  };
  const std::string of_rank = ranks > 1 ? " of rank " + std::to_string(rank) + " / " + std::to_string(ranks) : "";
  const std::string shard = ranks > 1 ? " (shards)" : "";
  return "memory plan" + of_rank + " (" + policy.name() + "): fast tier peak " + mib(peak_fast) + " at " + peak_at +
         "\n  parameters " + mib(parameters) + ", gradients " + mib(gradients) + ", optimizer state " +
         mib(optimizer_state) + shard + ", model buffers " + mib(model_buffers) +
         (ranks > 1 ? ", gathered units " + mib(gathered_at_peak) : std::string()) + "\n  activations " +
         mib(activations_at_peak) + " of " + mib(activations_saved) + " saved, workspace " + mib(workspace_at_peak) +
         " (the loss's at most " + mib(loss_workspace) + ")" +
         "\n  activations by layer kind, kept of saved:" + [&] {
           std::string kinds;
           for (const KindActivations& k : activations_by_kind)
             kinds += " " + k.kind + " (" + std::to_string(k.layers) + ") " + mib(k.kept) + " of " + mib(k.saved) +
                      (k.exchanged > 0 ? " (" + mib(k.exchanged) + " the exchange's rows)" : "") + ";";
           if (!kinds.empty()) kinds.pop_back();
           return kinds;
         }() +
         "\n  start-up " + mib(start_up) +
         (checkpoint_save > 0 ? ", a whole checkpoint's save " + mib(checkpoint_save) : std::string()) +
         "; slow tier (swap file) " + mib(peak_slow);
}

std::vector<MemoryPolicy> budget_candidates() {
  return {{"none", "none"},      {"none", "selective"}, {"none", "full"},
          {"selective", "none"}, {"full", "none"},      {"full", "attn_input"}};
}

MemoryPlan choose_policy(const ModelConfig& config, const ParamTable& table, const StepMemoryShape& shape,
                         int64_t budget) {
  MemoryPlan smallest;
  for (const MemoryPolicy& policy : budget_candidates()) {
    const MemoryPlan plan = plan_memory(config, table, shape, policy);
    if (shape.cp > 1 && plan.reruns_mixers) continue;
    if (plan.peak_fast <= budget) return plan;
    if (smallest.peak_at.empty() || plan.peak_fast < smallest.peak_fast) smallest = plan;
  }
  fail("--memory-budget ", budget, " bytes: no policy fits; the smallest peak is ", smallest.peak_fast, " bytes (",
       smallest.policy.name(), ", at ", smallest.peak_at, "); expected a budget of at least that");
}

void require_no_mixer_reruns(const MemoryPlan& plan, int cp) {
  if (cp > 1 && plan.reruns_mixers)
    fail("--cp ", cp, ": the memory policy ", plan.policy.name(), " re-runs mixer sublayers, which context ",
         "parallelism does not do yet; expected a policy that re-runs FFNs only (--recompute selective or FFN tags), ",
         "--swap, or --cp 1");
}

int64_t parse_bytes(const std::string& text, const char* option) {
  size_t end = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string suffix = text.substr(end);
  for (const char* tail : {"iB", "B"})
    if (suffix.size() >= std::string(tail).size() && suffix.compare(suffix.size() - std::string(tail).size(),
                                                                    std::string::npos, tail) == 0) {
      suffix.resize(suffix.size() - std::string(tail).size());
      break;
    }
  const std::string units = "KMGT";
  double scale = 1.0;
  if (suffix.size() == 1 && units.find(suffix[0]) != std::string::npos)
    scale = std::pow(1024.0, double(units.find(suffix[0]) + 1));
  else if (!suffix.empty())
    end = 0;
  if (end == 0 || !(value > 0.0) || !std::isfinite(value * scale) || value * scale > 9.0e18)
    fail(option, " ", text, ": expected a positive size in bytes, optionally with K, M, G or T (powers of 1024)");
  return static_cast<int64_t>(value * scale);
}

}  // namespace trillion
