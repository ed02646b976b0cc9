// Context parallelism (docs/architecture.md, "Context parallelism"): each sequence is split over
// the ranks of a context-parallel group, so that one sequence's activations divide over them.
//
// The split is causally balanced, as in Megatron-Core: the sequence is cut into 2 · cp chunks whose
// lengths differ by at most one (the longer ones first, so any length works), and rank i holds
// chunks i and 2 · cp − 1 − i back to back. Under causal attention an early chunk's queries see few
// keys and a late chunk's many, so every rank gets the same share of the work (to a chunk's length).
//
// Attention across the split (full attention and GQA): every rank needs the keys and values of all
// earlier positions. The forward all-gathers the group's keys and values into whole sequences and
// runs ops/attention.h once per local chunk, its queries against the keys up to the chunk's end
// (bottom-right causal, so chunk positions need no offset); document masks give each token's
// document start as a global position. The backward gathers them again (nothing gathered is kept
// between the passes, so the memory stays divided), forms each chunk's gradients, and sums the
// group's key and value gradients onto their owners (a reduce-scatter).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/step.h"
#include "ops/attention.h"
#include "parallel/process_group.h"

namespace trillion {

class ContextSplit {
 public:
  // `seq` tokens per sequence over `ranks` ranks; fails unless every chunk holds a token
  // (seq ≥ 2 · ranks), naming `flag` (the sequence length's flag or field).
  ContextSplit(int64_t seq, int ranks, const char* flag = "--seq-len");

  struct Span {
    int64_t begin = 0, end = 0;  // global positions [begin, end)
    int64_t size() const { return end - begin; }
  };

  int64_t seq() const { return seq_; }
  int ranks() const { return ranks_; }
  // Chunk c of the 2 · ranks chunks.
  Span chunk(int c) const;
  // Rank r's chunks r and 2 · ranks − 1 − r, in the order it holds them.
  std::array<Span, 2> spans(int rank) const { return {chunk(rank), chunk(2 * ranks_ - 1 - rank)}; }
  int64_t local_len(int rank) const;
  // The global position of each of rank r's tokens, [local_len(r)].
  std::vector<int32_t> positions(int rank) const;

 private:
  int64_t seq_ = 0;
  int ranks_ = 1;
};

// Bytes a rank received from the other ranks of its group: the others' rows it gathered, and the
// other ranks' partial sums of its own rows.
struct ContextTraffic {
  int64_t gathered_bytes = 0;
  int64_t reduced_bytes = 0;
  int64_t total() const { return gathered_bytes + reduced_bytes; }
};

// The traffic of one context_attention_forward and one context_attention_backward on `rank`, for
// the sizes of its local attention (batch, heads, dims) and element_bytes = sizeof(T): the forward
// gathers the other ranks' key and value rows; the backward gathers them again and receives the
// other ranks' sums of its own rows' key and value gradients.
struct ContextAttentionTraffic {
  ContextTraffic forward, backward;
};
ContextAttentionTraffic context_attention_traffic(const ContextSplit& split, int rank, const AttentionSizes& local,
                                                  int64_t element_bytes);

// x [batch, 2 · ranks, count]: a slot of `count` values per (sequence, chunk). Each rank's slots of
// its own chunks are gathered into every rank's x, in place; traffic, when not null, is added to.
template <class T>
void gather_chunk_slots(T* x, int64_t batch, int64_t count, const ContextSplit& split, const ProcessGroup& group,
                        ContextTraffic* traffic);

// Causal attention of this rank's tokens over every visible token of their sequences. Tensors are
// the local ones of ops/attention.h with q_len = kv_len = split.local_len(group.rank()): q [batch,
// local, q_heads, head_dim], k [batch, local, kv_heads, head_dim], v [batch, local, kv_heads,
// v_dim], out [batch, local, q_heads, v_dim], lse [batch, q_heads, local]; local.doc_start
// [batch, local] holds global positions. The group is the context-parallel group (split.ranks()
// ranks); traffic, when not null, is added to.
template <class T>
void context_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& local,
                               const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic);

// Its backward: dq, dk, dv of the local tokens are written (=); dk and dv sum every rank's terms.
template <class T>
void context_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                const T* lse, const AttentionSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic);

// A run's context parallelism, as the model sees it (model/step.h's ContextExchange): this rank's
// part of sequences of `seq` tokens split over `group` (which must outlive it), and the bytes it has
// received so far.
class ContextParallel final : public ContextExchange {
 public:
  ContextParallel(const ProcessGroup& group, int64_t seq, const char* flag = "--seq-len");
  const ContextSplit& split() const { return split_; }
  const ContextTraffic& traffic() const { return traffic_; }
  const int32_t* positions(int64_t seq) const override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionSizes& local) override {
    context_attention_forward(out, lse, q, k, v, local, split_, group_, &traffic_);
  }
  void attention_forward(double* out, double* lse, const double* q, const double* k, const double* v,
                         const AttentionSizes& local) override {
    context_attention_forward(out, lse, q, k, v, local, split_, group_, &traffic_);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const AttentionSizes& local) override {
    context_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, local, split_, group_, &traffic_);
  }
  void attention_backward(double* dq, double* dk, double* dv, const double* dout, const double* q, const double* k,
                          const double* v, const double* out, const double* lse, const AttentionSizes& local) override {
    context_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, local, split_, group_, &traffic_);
  }
  // parallel/context_conv1d.h and context_delta_rule.h (context_parallel.cpp).
  void conv1d_silu_forward(float* y, const float* x, const float* w, const Conv1dSizes& local) override;
  void conv1d_silu_forward(double* y, const double* x, const double* w, const Conv1dSizes& local) override;
  void conv1d_silu_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                            const Conv1dSizes& local) override;
  void conv1d_silu_backward(double* dx, double* dw, const double* dy, const double* x, const double* w,
                            const Conv1dSizes& local) override;
  void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* g, const float* beta,
                          const DeltaRuleSizes& local) override;
  void delta_rule_forward(double* o, const double* q, const double* k, const double* v, const double* g,
                          const double* beta, const DeltaRuleSizes& local) override;
  void delta_rule_backward(float* dq, float* dk, float* dv, float* dg, float* dbeta, const float* d_o, const float* q,
                           const float* k, const float* v, const float* g, const float* beta,
                           const DeltaRuleSizes& local) override;
  void delta_rule_backward(double* dq, double* dk, double* dv, double* dg, double* dbeta, const double* d_o,
                           const double* q, const double* k, const double* v, const double* g, const double* beta,
                           const DeltaRuleSizes& local) override;

 private:
  const ProcessGroup& group_;
  ContextSplit split_;
  std::vector<int32_t> positions_;  // [split_.local_len(rank)]
  ContextTraffic traffic_;
};

}  // namespace trillion
