// Fsdp<T>: fully sharded parameters and gradients for one single-device Model, applied through its
// unit hooks (docs/architecture.md, "Parallelism is applied to the model"). The FSDP units are the parameter table's
// units (model.h's unit_order): 0 the embeddings, 1 + l decoder layer l (its dense and expert ranges
// together), 1 + L the final norm and the LM head; tied embeddings make those one unit, 0, in use
// from the embedding to the head.
//
// Each rank keeps its shard (parallel/shard_layout.h) of the parameters, the master copy its
// optimizer updates, and of the gradients; of a LoRA base's frozen tensors its frozen shard, which
// is gathered with its unit like the rest and has no gradients to reduce-scatter. Under bf16
// gathers the frozen shard's products-only parts are kept in bf16 alone (the base's linear weights
// take their bf16 values, as on one rank: model/frozen_base.cpp), gathered as they are. Prefetch: each unit's hook starts the gather of the unit
// that follows it in the unit order (non-blocking) before its own compute, so two units (three, when
// tied: unit 0 stays) may be gathered at once. The model's flat buffers hold a unit only while it is
// in use, and of its experts only this rank's ep slice (gathered over its edp group): before a unit's
// forward and again before its backward its parameters are all-gathered, after
// each they are released; after a unit's backward in the step's last micro-batch its gradients are
// reduce-scattered into the shard and released (earlier micro-batches accumulate into the flat
// gradients, so a step reduce-scatters once). Released: the memory pages wholly inside the unit's
// range go back to the OS (madvise MADV_DONTNEED; they read as zeros and cost nothing until touched
// again; the gradients' partial pages at the range's ends are zeroed), so resident parameter and
// gradient memory is the shard plus the units in use. Non-trainable buffers (router biases) are
// not sharded: every rank keeps and updates them alike.
//
// Under the bf16 precision (float parameters, ops/gemm.h's MatmulPrecision) products read each
// weight's bf16 rounding, so a unit is gathered in runs of its tensors' uses (ShardLayout::Run):
// products-only runs (linear layers' weights) as bf16 into a bf16 copy of the flat parameters,
// registered as their copy (RegisteredBf16Copy), half the bytes moved and held; the others
// (norms, biases, the router, embeddings) as float into the parameters, tied embeddings also
// rounded into the copy for the LM head. The gathers never write the float parameters of a
// products-only run: nothing reads them (gather_everything, for a checkpoint, writes them all
// between steps). Each rank rounds its part of a run into the copy and gathers the
// rest in place, so nothing but the gathered units is held in bf16. The same bits as float
// gathers whose products round each weight (tests/parallel/fsdp_test.cpp).
//
// Counted per rank: bytes moved by the gathers and the reduce-scatters (each collective moves the
// unit's elements other than this rank's piece, in or out: the volume of a ring algorithm; a step's
// are ShardLayout::gather_bytes and reduce_scatter_bytes, which `trillion plan` predicts by) and
// the peak of gathered parameter bytes (in flight included).
//
// MemoryStats' fast tier follows what is resident: the released ranges of the model's flat buffers
// are taken out of it, a unit's parameters count from the start of their gather to their release,
// its gradients from the model's first write of them in a step (UnitHooks::before_gradients) to
// their reduce-scatter. So a rank's measured peak is its shard, the units in use and its
// activations, as the memory plan counts them (train/memory_plan.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/memory.h"
#include "model/model.h"
#include "ops/gemm.h"
#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace trillion {

struct FsdpCounters {
  int64_t gathered_bytes = 0;          // all-gathers of parameters
  int64_t reduce_scattered_bytes = 0;  // reduce-scatters of gradients
  int64_t peak_gathered_bytes = 0;     // the most parameter bytes gathered at once
};

template <class T>
class Fsdp {
 public:
  // Takes the rank's shard from the model's (initialized or loaded) parameters and releases them.
  // `group` is the world, `edp` this rank's edp group (the ranks of its ep index: they share its
  // expert slices); both must outlive this object.
  // `gathers`: as the matmul precision says (bf16 runs under bf16 with float parameters), or
  // float whatever it says (for comparisons).
  Fsdp(Model<T>& model, const ProcessGroup& group, const ProcessGroup& edp, const ShardLayout& layout,
       Operands gathers = Operands::as_set);
  ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // Gather / release / reduce-scatter around each unit, for Model::set_unit_hooks (the object
  // must outlive the model's use of them).
  UnitHooks hooks();
  // Whether the coming forward_backward is its step's last micro-batch (see above); default true.
  void set_last_micro_batch(bool last) { last_micro_batch_ = last; }

  T* shard_params() { return shard_params_.data(); }  // [layout.shard_size()]
  T* shard_grads() { return shard_grads_.data(); }    // [layout.shard_size()]
  // Every parameter gathered over the world, the other ep slices' experts too (writing a
  // checkpoint: every rank calls it), or without `frozen_too` the trainable ones alone; then
  // release_everything.
  void gather_everything(bool frozen_too = true);
  void release_everything();
  // The frozen shard in the layout's float form (ShardLayout::frozen_slices), its bf16 parts
  // widened: what a sharded checkpoint writes.
  Buffer<T> frozen_shard() const;

  int64_t shard_size() const { return layout_.shard_size(); }
  int64_t frozen_shard_size() const { return layout_.frozen_shard_size(); }  // LoRA's base: parameters alone
  int64_t frozen_shard_bytes() const { return frozen_parts_.bytes(sizeof(T)); }  // as held (bf16 parts)
  // Elements of the ranges this rank gathers to use (all dense ones, its ep slice of the experts).
  int64_t held_elements() const;
  const FsdpCounters& counters() const { return counters_; }
  void reset_peak() { counters_.peak_gathered_bytes = gathered_now_; }

 private:
  enum class UnitState { released, in_flight, gathered };
  const ProcessGroup& group_of(const ShardLayout::Unit& piece) const;  // the world, or the edp group
  ProcessGroup::Pending start_run(int i, size_t r);  // run r of layout unit i
  void keep_frozen_parts();
  // One of this rank's parts of a frozen run: at flat[flat, +count) and frozen-shard[local, +count)
  // (the layout's float form), held at `at` of frozen_bf16_ (in_bf16) or frozen_float_.
  struct FrozenPart {
    int64_t flat, local, at, count;
    bool in_bf16;
  };
  template <class F>
  void for_each_frozen_part(F&& f) const;
  // Whether a run's frozen part is held in bf16 alone (products-only, bf16 gathers).
  bool in_bf16(const ShardLayout::Run& run) const { return bf16_gathers_ && run.use == ParamUse::products; }
  void start_gather(int unit);  // unless it is in flight or gathered
  void gather(int unit);        // completes it (starting it first unless prefetched)
  void release(int unit);
  void reduce_scatter(int unit);
  void count(int64_t bytes);    // resident again: into MemoryStats' fast tier
  void uncount(int64_t bytes);  // released: out of it
  Model<T>& model_;
  const ProcessGroup& group_;
  const ProcessGroup& edp_;
  const ShardLayout& layout_;
  std::vector<std::vector<int>> pieces_of_unit_;  // [table units] indices into layout_.units()
  std::vector<std::vector<ShardLayout::Run>> runs_;  // [layout units] how each range is gathered
  std::vector<int64_t> gathered_bytes_;           // [layout units] bytes a gathered range holds
  std::vector<UnitState> state_;                  // [table units]
  std::vector<bool> grads_resident_;              // [table units] written since their last reduce-scatter
  std::vector<int64_t> held_bytes_of_unit_;       // [table units] gradient bytes of its trainable ranges here
  std::vector<int> next_forward_, next_backward_;  // [table units] the unit after it in unit_order, or -1
  struct InFlight {
    const ProcessGroup* group;
    ProcessGroup::Pending pending;
  };
  std::vector<std::vector<InFlight>> in_flight_;  // [table units] gathers not yet complete
  Buffer<T> shard_params_, shard_grads_;          // [layout.shard_size()] each
  // LoRA's frozen base as held (ShardLayout::frozen_parts): float parts, and bf16 ones.
  ShardLayout::FrozenParts frozen_parts_;
  Buffer<T> frozen_float_;     // [frozen_parts_.float_elements]
  Buffer<bf16> frozen_bf16_;   // [frozen_parts_.bf16_elements]
  bool bf16_gathers_ = false;
  // bf16 gathers: the flat parameters' copy the products read; empty otherwise.
  Buffer<bf16> params_bf16_;  // [table.sharded_size()]
  std::optional<RegisteredBf16Copy> registration_;  // of params_bf16_ for the model's parameters
  bool last_micro_batch_ = true;
  bool frozen_gathered_ = true;  // the model's frozen ranges hold the base (at construction, or gathered whole)
  int64_t gathered_now_ = 0;  // parameter bytes gathered at the moment
  int64_t uncounted_bytes_ = 0;  // bytes of the model's flat buffers taken out of MemoryStats
  FsdpCounters counters_;
};

}  // namespace trillion
