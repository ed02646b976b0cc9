// ExpertParallel: the routed experts of every MoE layer split over an expert-parallel group of ep
// ranks (rank p of the group owns experts [p · E/ep, (p + 1) · E/ep)), with all-to-all dispatch and
// combine (docs/architecture.md, "The parallel layout"; the seam is model/step.h's ExpertExchange).
//
// Forward of one MoE layer on each rank, for its own tokens:
//   1. its permuted rows (the plan's expert-major order: rows bound for one owner are contiguous)
//      carry the token's input; the per-expert row counts are exchanged (all-to-all of counts);
//   2. dispatch: all-to-all-v of the rows to their experts' owners;
//   3. the owner runs its experts over every row it received (the fused grouped GEMM of
//      ops/moe_experts.h, each received row a slot of weight 1, grouped by expert by the plan);
//   4. combine: all-to-all-v of the output rows back, and y[t] += Σ_j weight[t, j] · out(t, j)
//      over j in order (one thread per token).
// Backward reverses it: the output gradients travel to the owners (the backward of a combine is a
// dispatch), and the owners, which received each row's combine weight with it in the forward, run
// the fused backward as one rank does: each row's dweight = <dy[t], out(t, j)> (from its act, so
// the outputs need not be kept), its input gradient, their experts' weight gradients; the input
// gradients and the dweights travel back (the backward of a dispatch is a combine).
//
// Overlap: with chunks > 1 the rank's tokens are cut into that many ranges, and each chunk's rows
// travel while another chunk's experts compute: dispatch of chunk c + 1 and combine of chunk c − 1
// are in flight (non-blocking all-to-all-v) during chunk c's grouped GEMMs, in forward and backward.
// The results equal one chunk's to rounding (the expert weight gradients sum chunk by chunk). The
// rows' weights (forward, before the pipeline) and their dweights (backward, after it) travel in
// blocking exchanges of their own, one value per row.
// `wait_s` counts the time spent waiting for exchanges to complete: the communication not hidden.
//
// Kept between forward and backward, as saved tensors of the MoE layer in the activation store
// (model/step.h's ExchangedRows; tags of kind exchanged): the received rows with their sources and
// their owner-side expert activations (gate_up, act: R rows) and combine weights. R, the number of
// rows routed to this rank's experts, is at most
// ep · N · k and differs between ranks. Capacity applies per rank to its own tokens. Swap may move
// these tensors; recompute drops only the activations, which the owner's fused backward forms again
// from the received rows (no re-run), so a re-run MoE sublayer does not exchange again and each rank
// may re-run its sublayers alone. Nothing is kept here between calls.
#pragma once

#include <cstdint>

#include "model/step.h"
#include "parallel/process_group.h"

namespace trillion {

struct ExpertParallelCounters {
  int64_t dispatched_bytes = 0;  // rows sent to other ranks (forward: with their weights; backward dispatch)
  int64_t combined_bytes = 0;    // rows sent back (forward combine; backward: with their dweights)
  double wait_s = 0.0;           // waiting for exchanges to complete
};

// The bytes each rank's exchange sends in a step (its counters; metrics' "expert_parallel"), from
// every rank's routed rows per expert of each MoE layer, summed over the step's micro-batches
// (loads[layer][rank][expert], as metrics' rank_tokens_per_expert; fractional for a plan's expected
// rows). A row bound for another rank's expert goes there twice (the token's input forward, its
// output gradient backward) and its weight once; each row a rank's experts receive from another
// rank goes back twice (the output forward, the input gradient backward) with its dweight.
// ranks = loads[l].size(), a multiple of ep (rank = edp index · ep + ep index, parallel/mesh.h).
struct ExchangeBytes {
  double dispatched = 0.0, combined = 0.0;
};
std::vector<ExchangeBytes> exchange_bytes(const std::vector<std::vector<std::vector<double>>>& loads, int ep,
                                          int64_t hidden, int64_t element_bytes);

class ExpertParallel final : public ExpertExchange {
 public:
  // The group must outlive this object; chunks ≥ 1 token ranges per layer (see Overlap above).
  explicit ExpertParallel(const ProcessGroup& group, int chunks = 1);

  void forward(float* y, const float* x, const float* gate_up, const float* down, const float* weight,
               const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<float>& adapters,
               const ExchangedRowsFor<float>& save) override;
  void forward(double* y, const double* x, const double* gate_up, const double* down, const double* weight,
               const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<double>& adapters,
               const ExchangedRowsFor<double>& save) override;
  void backward(float* dx, float* dweight, float* dgate_up, float* ddown, const float* dy, const float* gate_up,
                const float* down, const float* weight, const MoePlan& plan, const MoeExpertDims& dims,
                const ExpertAdapters<float>& adapters, const ExpertAdapters<float>& adapter_grads,
                const ExchangedRows<const float>& saved) override;
  void backward(double* dx, double* dweight, double* dgate_up, double* ddown, const double* dy,
                const double* gate_up, const double* down, const double* weight, const MoePlan& plan,
                const MoeExpertDims& dims, const ExpertAdapters<double>& adapters,
                const ExpertAdapters<double>& adapter_grads, const ExchangedRows<const double>& saved) override;

  const ExpertParallelCounters& counters() const { return counters_; }
  // Between steps: the chunks of the next steps (a layer's backward uses its forward's).
  void set_chunks(int chunks);

 private:
  int64_t chunks_of(int64_t tokens) const;  // min(chunks, tokens), at least 1
  template <class T>
  void forward_impl(T* y, const T* x, const T* gate_up, const T* down, const T* weight, const MoePlan& plan,
                    const MoeExpertDims& dims, const ExpertAdapters<T>& adapters, const ExchangedRowsFor<T>& save);
  template <class T>
  void backward_impl(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* gate_up, const T* down,
                     const T* weight, const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<T>& adapters,
                     const ExpertAdapters<T>& adapter_grads, const ExchangedRows<const T>& saved);
  void finish_timed(ProcessGroup::Pending& pending);  // completes it, counting the wait
  const ProcessGroup& group_;
  int chunks_ = 1;
  ExpertParallelCounters counters_;
};

}  // namespace trillion
