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
// group's key and value gradients onto their owners (a reduce-scatter). The model's layers call
// those three pieces themselves (ContextParallel), so that the whole keys stay in the layer's
// scratch for the lightning indexer's loss, and MLA gathers its absorbed rows [e | k_rot] rather
// than its keys (model/mla_absorbed.h); context_attention_forward / _backward compose them for
// full attention (the benchmark's).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/memory_sizes.h"
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
  // Rank r's chunks with their first local positions (ContextExchange::chunks).
  std::array<ContextChunk, 2> local_chunks(int rank) const;
  // The global position of each of rank r's tokens, [local_len(r)].
  std::vector<int32_t> positions(int rank) const;
  // local [batch, local_len(rank)] ← rank r's tokens of each row of whole [batch, seq]; local may be
  // whole (in place).
  void take_local(int32_t* local, const int32_t* whole, int64_t batch, int rank) const;

 private:
  int64_t seq_ = 0;
  int ranks_ = 1;
};

// A gathered tensor's traffic on `rank`: rows of `row` elements per token (element_bytes each) that
// the forward all-gathers (context_gather_sequences), the backward gathers again, and whose
// gradients it sums onto their owners (context_reduce_sequences).
ContextPassTraffic context_gathered_rows_traffic(const ContextSplit& split, int rank, int64_t batch, int64_t row,
                                                 int64_t element_bytes);
// The traffic of one context_attention_forward and one context_attention_backward on `rank`, for
// the sizes of its local attention (batch, heads, dims) and element_bytes = sizeof(T): the keys and
// values are the gathered rows.
ContextPassTraffic context_attention_traffic(const ContextSplit& split, int rank, const AttentionSizes& local,
                                             int64_t element_bytes);

// whole [batch, seq, row] ← the whole sequences of every rank's local [batch, local_len, row]: per
// sequence, the first chunks and then the second chunks, each one all-gather that places every
// rank's rows at their positions.
template <class T>
void context_gather_sequences(T* whole, const T* local, int64_t batch, int64_t row, const ContextSplit& split,
                              const ProcessGroup& group, ContextTraffic* traffic);
// local [batch, local_len, row] ← the sum over the group of every rank's whole [batch, seq, row] at
// this rank's positions (a reduce-scatter per sequence and chunk); `whole` is overwritten.
template <class T>
void context_reduce_sequences(T* local, T* whole, int64_t batch, int64_t row, const ContextSplit& split,
                              const ProcessGroup& group, ContextTraffic* traffic);

// x [batch, 2 · ranks, count]: a slot of `count` values per (sequence, chunk). Each rank's slots of
// its own chunks are gathered into every rank's x, in place; traffic, when not null, is added to.
template <class T>
void gather_chunk_slots(T* x, int64_t batch, int64_t count, const ContextSplit& split, const ProcessGroup& group,
                        ContextTraffic* traffic);

// Causal attention of this rank's tokens over the keys and values of their whole sequences, already
// gathered: q [batch, local, q_heads, head_dim], k_whole [batch, seq, kv_heads, head_dim], v_whole
// [batch, seq, kv_heads, v_dim], out [batch, local, q_heads, v_dim], lse [batch, q_heads, local];
// local.q_len = split.local_len(rank), local.kv_len = split.seq(); local.doc_start [batch, local]
// holds global positions. Each local chunk runs ops/attention.h against the keys up to its end, or
// with a selection [batch, local, topk] (global key positions, −1 padded) ops/sparse_attention.h
// over the selected keys, which must be visible to their queries.
template <class T>
void context_attention_forward_gathered(T* out, T* lse, const T* q, const T* k_whole, const T* v_whole,
                                        const AttentionSizes& local, const ContextSplit& split, int rank,
                                        const int32_t* selection = nullptr, int64_t topk = 0);
// Its backward: dq of the local tokens is written (=), dk_whole and dv_whole [batch, seq, ...] get
// this rank's terms of every position's key and value gradients (=; zero past its last chunk).
template <class T>
void context_attention_backward_gathered(T* dq, T* dk_whole, T* dv_whole, const T* dout, const T* q,
                                         const T* k_whole, const T* v_whole, const T* out, const T* lse,
                                         const AttentionSizes& local, const ContextSplit& split, int rank,
                                         const int32_t* selection = nullptr, int64_t topk = 0);

// The same with the local keys and values, gathered here: tensors are the local ones of
// ops/attention.h with q_len = kv_len = split.local_len(group.rank()), k [batch, local, kv_heads,
// head_dim], v [batch, local, kv_heads, v_dim]. The group is the context-parallel group
// (split.ranks() ranks); traffic, when not null, is added to; selection and topk as
// context_attention_forward_gathered's.
template <class T>
void context_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& local,
                               const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic,
                               const int32_t* selection = nullptr, int64_t topk = 0);

// Its backward: dq, dk, dv of the local tokens are written (=); dk and dv sum every rank's terms.
template <class T>
void context_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                const T* lse, const AttentionSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic, const int32_t* selection = nullptr,
                                int64_t topk = 0);

// The memory plan's view of rank `rank` of a split (model/memory_sizes.h): what its exchange's calls
// hold at their peak and receive, each formula beside the call it counts (context_parallel.cpp,
// context_conv1d.cpp, context_delta_rule.cpp).
class ContextSplitPlan final : public ContextPlan {
 public:
  ContextSplitPlan(const ContextSplit& split, int rank) : split_(split), rank_(rank) {}
  const ContextSplit& split() const { return split_; }
  int rank() const { return rank_; }
  int64_t sequence_length() const override { return split_.seq(); }
  std::array<ContextChunk, 2> chunks() const override { return split_.local_chunks(rank_); }
  Workspace gathered_attention(const AttentionSizes& local, int64_t topk, bool bf16_rows, int threads,
                               int64_t element_bytes) const override;
  ContextPassTraffic gathered_rows(int64_t batch, int64_t row, int64_t element_bytes) const override;
  ContextCost conv1d_silu(const Conv1dSizes& local, int64_t element_bytes) const override;
  ContextCost delta_rule(const DeltaRuleSizes& local, int threads, int64_t element_bytes) const override;

 private:
  ContextSplit split_;
  int rank_ = 0;
};

// A run's context parallelism, as the model sees it (model/step.h's ContextExchange): this rank's
// part of sequences of `seq` tokens split over `group` (which must outlive it), and the bytes it has
// received so far.
class ContextParallel final : public ContextExchange {
 public:
  ContextParallel(const ProcessGroup& group, int64_t seq, const char* flag = "--seq-len");
  const ContextSplit& split() const { return split_; }
  const ContextTraffic& traffic() const { return traffic_; }
  int rank() const { return group_.rank(); }  // in its group
  const int32_t* positions(int64_t seq) const override;
  std::array<ContextChunk, 2> chunks() const override { return split_.local_chunks(group_.rank()); }
  int64_t sequence_length() const override { return split_.seq(); }
  void sum_over_group(double* values, int64_t count) override { group_.all_reduce_sum(values, count); }
  void document_starts(int32_t* doc_start, const int32_t* tokens, int64_t batch, int32_t eos) override;
  // Gathered rows and attention over them, and parallel/context_conv1d.h and context_delta_rule.h
  // (context_parallel.cpp).
  void gather_sequences(float* whole, const float* local, int64_t batch, int64_t row) override;
  void gather_sequences(double* whole, const double* local, int64_t batch, int64_t row) override;
  void reduce_sequences(float* local, float* whole, int64_t batch, int64_t row) override;
  void reduce_sequences(double* local, double* whole, int64_t batch, int64_t row) override;
  void gathered_attention_forward(float* out, float* lse, const float* q, const float* k_whole, const float* v_whole,
                                  const int32_t* selection, int64_t topk, const AttentionSizes& local) override;
  void gathered_attention_forward(double* out, double* lse, const double* q, const double* k_whole,
                                  const double* v_whole, const int32_t* selection, int64_t topk,
                                  const AttentionSizes& local) override;
  void gathered_attention_backward(float* dq, float* dk_whole, float* dv_whole, const float* dout, const float* q,
                                   const float* k_whole, const float* v_whole, const float* out, const float* lse,
                                   const int32_t* selection, int64_t topk, const AttentionSizes& local) override;
  void gathered_attention_backward(double* dq, double* dk_whole, double* dv_whole, const double* dout,
                                   const double* q, const double* k_whole, const double* v_whole, const double* out,
                                   const double* lse, const int32_t* selection, int64_t topk,
                                   const AttentionSizes& local) override;

  void conv1d_silu_forward(float* y, const float* x, const float* w, const int32_t* doc_start,
                           const Conv1dSizes& local) override;
  void conv1d_silu_forward(double* y, const double* x, const double* w, const int32_t* doc_start,
                           const Conv1dSizes& local) override;
  void conv1d_silu_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                            const int32_t* doc_start, const Conv1dSizes& local) override;
  void conv1d_silu_backward(double* dx, double* dw, const double* dy, const double* x, const double* w,
                            const int32_t* doc_start, const Conv1dSizes& local) override;
  void delta_rule_forward(float* o, const float* q, const float* k, const float* v, const float* g, const float* beta,
                          const int32_t* doc_start, const DeltaRuleSizes& local) override;
  void delta_rule_forward(double* o, const double* q, const double* k, const double* v, const double* g,
                          const double* beta, const int32_t* doc_start, const DeltaRuleSizes& local) override;
  void delta_rule_backward(float* dq, float* dk, float* dv, float* dg, float* dbeta, const float* d_o, const float* q,
                           const float* k, const float* v, const float* g, const float* beta, const int32_t* doc_start,
                           const DeltaRuleSizes& local) override;
  void delta_rule_backward(double* dq, double* dk, double* dv, double* dg, double* dbeta, const double* d_o,
                           const double* q, const double* k, const double* v, const double* g, const double* beta,
                           const int32_t* doc_start, const DeltaRuleSizes& local) override;

 private:
  const ProcessGroup& group_;
  ContextSplit split_;
  std::vector<int32_t> positions_;  // [split_.local_len(rank)]
  ContextTraffic traffic_;
};

}  // namespace trillion
