// The causally balanced split, its gathers, attention across it, and ContextParallel (which hands the
// model the convolution and delta rule of context_conv1d.h and context_delta_rule.h). See
// context_parallel.h.
#include "parallel/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "parallel/context_conv1d.h"
#include "parallel/context_delta_rule.h"

namespace trillion {

ContextSplit::ContextSplit(int64_t seq, int ranks, const char* flag) : seq_(seq), ranks_(ranks) {
  if (ranks < 1) fail("--cp ", ranks, " must be ≥ 1");
  if (seq < 2 * int64_t(ranks))
    fail(flag, " ", seq, " is too short for --cp ", ranks, ": each rank holds two chunks of every sequence, so it ",
         "must be ≥ ", 2 * int64_t(ranks));
}

ContextSplit::Span ContextSplit::chunk(int c) const {
  const int64_t chunks = 2 * int64_t(ranks_), base = seq_ / chunks, longer = seq_ % chunks;
  const int64_t begin = c * base + std::min<int64_t>(c, longer);
  return {begin, begin + base + (c < longer ? 1 : 0)};
}

int64_t ContextSplit::local_len(int rank) const {
  const std::array<Span, 2> s = spans(rank);
  return s[0].size() + s[1].size();
}

std::vector<int32_t> ContextSplit::positions(int rank) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(local_len(rank)));
  for (const Span& span : spans(rank))
    for (int64_t p = span.begin; p < span.end; ++p) out.push_back(static_cast<int32_t>(p));
  return out;
}

ContextAttentionTraffic context_attention_traffic(const ContextSplit& split, int rank, const AttentionSizes& local,
                                                  int64_t element_bytes) {
  const int64_t row = local.kv_heads * (local.head_dim + local.value_dim());  // a token's key and value
  const int64_t own = local.batch * split.local_len(rank) * row * element_bytes;
  const int64_t others = local.batch * (split.seq() - split.local_len(rank)) * row * element_bytes;
  const ContextTraffic gather{others, 0};
  return {gather, {others, (split.ranks() - 1) * own}};
}

namespace {

void check_group(const ContextSplit& split, const ProcessGroup& group, const AttentionSizes& local) {
  TRILLION_CHECK(group.size() == split.ranks(), "context split over ", split.ranks(), " ranks, group of ",
                 group.size());
  const int64_t len = split.local_len(group.rank());
  TRILLION_CHECK(local.q_len == len && local.kv_len == len, "context attention: rank ", group.rank(), " holds ", len,
                 " tokens per sequence, sizes give q_len ", local.q_len, " and kv_len ", local.kv_len);
}

// Elements of a gather's pieces that come from the other ranks.
int64_t received_elements(const std::vector<int64_t>& counts, int me) {
  int64_t all = 0;
  for (const int64_t count : counts) all += count;
  return all - counts[me];
}

// [batch, seq, row]: the whole sequences of every rank's local [batch, local_len, row]. Every
// rank's first chunks, then every rank's second chunks, are each one all-gather per sequence that
// places each rank's rows at their positions (the second chunks land in reverse rank order).
template <class T>
Buffer<T> gather_sequences(const T* local, int64_t batch, int64_t row, const ContextSplit& split,
                           const ProcessGroup& group, ContextTraffic* traffic) {
  Buffer<T> whole(batch * split.seq() * row);  // [batch, seq, row]
  const int me = group.rank();
  const int64_t len = split.local_len(me);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t offset = 0;  // the chunk's first local position
    for (int which : {0, 1}) {
      std::vector<int64_t> counts, displs;  // in the sequence's rows
      for (int r = 0; r < split.ranks(); ++r) {
        const ContextSplit::Span span = split.spans(r)[which];
        counts.push_back(span.size() * row);
        displs.push_back(span.begin * row);
      }
      group.all_gather(local + (b * len + offset) * row, whole.data() + b * split.seq() * row, counts, displs);
      offset += split.spans(me)[which].size();
      if (traffic != nullptr) traffic->gathered_bytes += received_elements(counts, me) * int64_t(sizeof(T));
    }
  }
  return whole;
}

// local [batch, local_len, row] ← the sum over the group of every rank's whole [batch, seq, row] at
// this rank's positions; `whole` is overwritten. Per sequence, every rank's first chunk lies in rank
// order and is one reduce-scatter; the second chunks lie in reverse rank order, and are put in rank
// order in place (their region reversed, then each chunk reversed back) for the second.
template <class T>
void reduce_scatter_sequences(T* local, T* whole, int64_t batch, int64_t row, const ContextSplit& split,
                              const ProcessGroup& group, ContextTraffic* traffic) {
  const int me = group.rank();
  const int64_t len = split.local_len(me), seq = split.seq();
  for (int64_t b = 0; b < batch; ++b) {
    T* sequence = whole + b * seq * row;  // [seq, row]
    std::vector<int64_t> firsts, seconds;
    for (int r = 0; r < split.ranks(); ++r) {
      firsts.push_back(split.spans(r)[0].size() * row);
      seconds.push_back(split.spans(r)[1].size() * row);
    }
    group.reduce_scatter_sum(sequence, local + b * len * row, firsts);
    if (traffic != nullptr) traffic->reduced_bytes += (split.ranks() - 1) * firsts[me] * int64_t(sizeof(T));
    T* second = sequence + split.spans(split.ranks() - 1)[1].begin * row;  // [seq − half, row]
    std::reverse(second, sequence + seq * row);
    for (int64_t r = 0, at = 0; r < split.ranks(); at += seconds[r], ++r)
      std::reverse(second + at, second + at + seconds[r]);
    group.reduce_scatter_sum(second, local + (b * len + split.spans(me)[0].size()) * row, seconds);
    if (traffic != nullptr) traffic->reduced_bytes += (split.ranks() - 1) * seconds[me] * int64_t(sizeof(T));
  }
}

// A call's sizes and row widths, with the whole sequences' keys and values gathered from the group.
template <class T>
struct Gathered {
  int64_t batch, len, seq, heads, q_row, out_row, k_row, v_row;
  std::array<ContextSplit::Span, 2> spans;  // this rank's chunks
  Buffer<T> keys, values;                   // [batch, seq, k_row], [batch, seq, v_row]
  Gathered(const T* k, const T* v, const AttentionSizes& local, const ContextSplit& split, const ProcessGroup& group,
           ContextTraffic* traffic)
      : batch((check_group(split, group, local), local.batch)),
        len(local.q_len),
        seq(split.seq()),
        heads(local.q_heads),
        q_row(heads * local.head_dim),
        out_row(heads * local.value_dim()),
        k_row(local.kv_heads * local.head_dim),
        v_row(local.kv_heads * local.value_dim()),
        spans(split.spans(group.rank())),
        keys(gather_sequences(k, batch, k_row, split, group, traffic)),
        values(gather_sequences(v, batch, v_row, split, group, traffic)) {}
};

// One local chunk of one sequence as ops/attention.h sizes: its queries against the keys up to its
// end, bottom-right causal; `offset` is the chunk's first local position.
AttentionSizes chunk_sizes(const AttentionSizes& local, const ContextSplit::Span& span, int64_t b, int64_t offset) {
  AttentionSizes c = local;
  c.batch = 1;
  c.q_len = span.size();
  c.kv_len = span.end;
  if (local.doc_start != nullptr) c.doc_start = local.doc_start + b * local.q_len + offset;
  return c;
}

}  // namespace

template <class T>
void gather_chunk_slots(T* x, int64_t batch, int64_t count, const ContextSplit& split, const ProcessGroup& group,
                        ContextTraffic* traffic) {
  const int64_t chunks = 2 * int64_t(split.ranks());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < 2; ++s) {
      std::vector<int64_t> counts(split.ranks(), count), displs;  // in the sequence's slots
      for (int r = 0; r < split.ranks(); ++r) displs.push_back((s == 0 ? r : chunks - 1 - r) * count);
      T* slots = x + b * chunks * count;  // [chunks, count]
      group.all_gather(slots + displs[group.rank()], slots, counts, displs);
      if (traffic != nullptr) traffic->gathered_bytes += received_elements(counts, group.rank()) * int64_t(sizeof(T));
    }
}

template <class T>
void context_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& local,
                               const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic) {
  const Gathered<T> at(k, v, local, split, group, traffic);
  const int64_t batch = at.batch, len = at.len, seq = at.seq, heads = at.heads;
  Buffer<T> chunk_lse(heads * std::max(at.spans[0].size(), at.spans[1].size()));  // [heads, chunk]
  for (int64_t b = 0; b < batch; ++b) {
    int64_t offset = 0;
    for (const ContextSplit::Span& span : at.spans) {
      const AttentionSizes sizes = chunk_sizes(local, span, b, offset);
      attention_forward(out + (b * len + offset) * at.out_row, chunk_lse.data(), q + (b * len + offset) * at.q_row,
                        at.keys.data() + b * seq * at.k_row, at.values.data() + b * seq * at.v_row, sizes);
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(chunk_lse.data() + h * span.size(), span.size(), lse + (b * heads + h) * len + offset);
      offset += span.size();
    }
  }
}

template <class T>
void context_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                const T* lse, const AttentionSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic) {
  const Gathered<T> at(k, v, local, split, group, traffic);
  const int64_t batch = at.batch, len = at.len, seq = at.seq, heads = at.heads;
  // This rank's terms of every position's key and value gradients; zero past its last chunk's end.
  Buffer<T> dkeys(batch * seq * at.k_row), dvalues(batch * seq * at.v_row);  // [batch, seq, k_row / v_row]
  // The earlier chunk's terms [its end, k_row / v_row], added to the later chunk's.
  Buffer<T> early_dk(at.spans[0].end * at.k_row), early_dv(at.spans[0].end * at.v_row);
  Buffer<T> chunk_lse(heads * std::max(at.spans[0].size(), at.spans[1].size()));  // [heads, chunk]
  const int64_t offsets[2] = {0, at.spans[0].size()};
  for (int64_t b = 0; b < batch; ++b) {
    for (int s : {1, 0}) {  // the later chunk writes its keys' rows; the earlier one's are added
      const ContextSplit::Span& span = at.spans[s];
      const int64_t offset = offsets[s];
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(lse + (b * heads + h) * len + offset, span.size(), chunk_lse.data() + h * span.size());
      T* dk_rows = s == 1 ? dkeys.data() + b * seq * at.k_row : early_dk.data();
      T* dv_rows = s == 1 ? dvalues.data() + b * seq * at.v_row : early_dv.data();
      attention_backward(dq + (b * len + offset) * at.q_row, dk_rows, dv_rows, dout + (b * len + offset) * at.out_row,
                         q + (b * len + offset) * at.q_row, at.keys.data() + b * seq * at.k_row,
                         at.values.data() + b * seq * at.v_row, out + (b * len + offset) * at.out_row, chunk_lse.data(),
                         chunk_sizes(local, span, b, offset));
    }
    T* dk_whole = dkeys.data() + b * seq * at.k_row;
    T* dv_whole = dvalues.data() + b * seq * at.v_row;
    for (int64_t i = 0; i < at.spans[0].end * at.k_row; ++i) dk_whole[i] += early_dk[i];
    for (int64_t i = 0; i < at.spans[0].end * at.v_row; ++i) dv_whole[i] += early_dv[i];
  }
  reduce_scatter_sequences(dk, dkeys.data(), batch, at.k_row, split, group, traffic);
  reduce_scatter_sequences(dv, dvalues.data(), batch, at.v_row, split, group, traffic);
}

ContextParallel::ContextParallel(const ProcessGroup& group, int64_t seq, const char* flag)
    : group_(group), split_(seq, group.size(), flag), positions_(split_.positions(group.rank())) {}

const int32_t* ContextParallel::positions(int64_t seq) const {
  TRILLION_CHECK(seq == int64_t(positions_.size()), "context parallelism: rank ", group_.rank(), " holds ",
                 positions_.size(), " tokens of each ", split_.seq(), "-token sequence, the batch has ", seq);
  return positions_.data();
}

// The float and double overrides of the convolution and the delta rule, written once.
#define TRILLION_CONTEXT_LINEAR_ATTENTION(T)                                                                         \
  void ContextParallel::conv1d_silu_forward(T* y, const T* x, const T* w, const Conv1dSizes& local) {                \
    TRILLION_CHECK(local.num_segments == 0, "context parallelism with document masks: not yet");                    \
    context_conv1d_silu_forward(y, x, w, nullptr, local, split_, group_, &traffic_);                                \
  }                                                                                                                 \
  void ContextParallel::conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w,                      \
                                             const Conv1dSizes& local) {                                            \
    TRILLION_CHECK(local.num_segments == 0, "context parallelism with document masks: not yet");                    \
    context_conv1d_silu_backward(dx, dw, dy, x, w, nullptr, local, split_, group_, &traffic_);                      \
  }                                                                                                                 \
  void ContextParallel::delta_rule_forward(T* o, const T* q, const T* k, const T* v, const T* g, const T* beta,      \
                                           const DeltaRuleSizes& local) {                                           \
    TRILLION_CHECK(local.num_segments == 0, "context parallelism with document masks: not yet");                    \
    Buffer<T> summaries(context_delta_rule_summary_count(split_, local)); /* formed again by the backward */        \
    context_delta_rule_forward(o, summaries.data(), q, k, v, g, beta, nullptr, local, split_, group_, &traffic_);   \
  }                                                                                                                 \
  void ContextParallel::delta_rule_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* d_o, const T* q,         \
                                            const T* k, const T* v, const T* g, const T* beta,                      \
                                            const DeltaRuleSizes& local) {                                          \
    TRILLION_CHECK(local.num_segments == 0, "context parallelism with document masks: not yet");                    \
    context_delta_rule_backward(dq, dk, dv, dg, dbeta, d_o, q, k, v, g, beta, static_cast<const T*>(nullptr),      \
                                nullptr, local, split_, group_, &traffic_);                                          \
  }
TRILLION_CONTEXT_LINEAR_ATTENTION(float)
TRILLION_CONTEXT_LINEAR_ATTENTION(double)
#undef TRILLION_CONTEXT_LINEAR_ATTENTION

template void gather_chunk_slots<float>(float*, int64_t, int64_t, const ContextSplit&, const ProcessGroup&,
                                        ContextTraffic*);
template void gather_chunk_slots<double>(double*, int64_t, int64_t, const ContextSplit&, const ProcessGroup&,
                                         ContextTraffic*);
template void context_attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                               const AttentionSizes&, const ContextSplit&, const ProcessGroup&,
                                               ContextTraffic*);
template void context_attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                                const AttentionSizes&, const ContextSplit&, const ProcessGroup&,
                                                ContextTraffic*);
template void context_attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                                const float*, const float*, const float*, const AttentionSizes&,
                                                const ContextSplit&, const ProcessGroup&, ContextTraffic*);
template void context_attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                                 const double*, const double*, const double*, const AttentionSizes&,
                                                 const ContextSplit&, const ProcessGroup&, ContextTraffic*);

}  // namespace trillion
