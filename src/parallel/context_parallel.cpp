// The causally balanced split, its gathers, attention across it, and ContextParallel (which hands the
// model the convolution and delta rule of context_conv1d.h and context_delta_rule.h). See
// context_parallel.h.
#include "parallel/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "ops/sparse_attention.h"
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

std::array<ContextChunk, 2> ContextSplit::local_chunks(int rank) const {
  const std::array<Span, 2> s = spans(rank);
  return {ContextChunk{0, s[0].begin, s[0].end}, ContextChunk{s[0].size(), s[1].begin, s[1].end}};
}

std::vector<int32_t> ContextSplit::positions(int rank) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(local_len(rank)));
  for (const Span& span : spans(rank))
    for (int64_t p = span.begin; p < span.end; ++p) out.push_back(static_cast<int32_t>(p));
  return out;
}

void ContextSplit::take_local(int32_t* local, const int32_t* whole, int64_t batch, int rank) const {
  const std::array<Span, 2> s = spans(rank);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = local + b * local_len(rank);
    for (const Span& span : s) {  // in place, every row moves toward the front
      std::memmove(row, whole + b * seq_ + span.begin, static_cast<size_t>(span.size()) * sizeof(int32_t));
      row += span.size();
    }
  }
}

ContextPassTraffic context_gathered_rows_traffic(const ContextSplit& split, int rank, int64_t batch, int64_t row,
                                                 int64_t element_bytes) {
  const int64_t own = batch * split.local_len(rank) * row * element_bytes;
  const int64_t others = batch * (split.seq() - split.local_len(rank)) * row * element_bytes;
  return {{others, 0}, {others, (split.ranks() - 1) * own}};
}

ContextPassTraffic context_attention_traffic(const ContextSplit& split, int rank, const AttentionSizes& local,
                                             int64_t element_bytes) {
  const int64_t row = local.kv_heads * (local.head_dim + local.value_dim());  // a token's key and value
  return context_gathered_rows_traffic(split, rank, local.batch, row, element_bytes);
}

namespace {

void check_group(const ContextSplit& split, const ProcessGroup& group) {
  TRILLION_CHECK(group.size() == split.ranks(), "context split over ", split.ranks(), " ranks, group of ",
                 group.size());
}

void check_sizes(const ContextSplit& split, int rank, const AttentionSizes& local, int64_t kv_len) {
  const int64_t len = split.local_len(rank);
  TRILLION_CHECK(local.q_len == len && local.kv_len == kv_len, "context attention: rank ", rank, " holds ", len,
                 " tokens of each ", split.seq(), "-token sequence, sizes give q_len ", local.q_len, " and kv_len ",
                 local.kv_len, " (expected ", kv_len, ")");
}

// Elements of a gather's pieces that come from the other ranks.
int64_t received_elements(const std::vector<int64_t>& counts, int me) {
  int64_t all = 0;
  for (const int64_t count : counts) all += count;
  return all - counts[me];
}

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

// The same chunk's sparse attention over `topk` selected keys per query.
SparseAttentionSizes sparse_chunk_sizes(const AttentionSizes& c, int64_t topk) {
  return {c.batch, c.q_len, c.kv_len, c.q_heads, c.kv_heads, c.head_dim, c.value_dim(), topk, c.scale, c.doc_start};
}

int64_t key_row(const AttentionSizes& local) { return local.kv_heads * local.head_dim; }
int64_t value_row(const AttentionSizes& local) { return local.kv_heads * local.value_dim(); }

}  // namespace

template <class T>
void context_gather_sequences(T* whole, const T* local, int64_t batch, int64_t row, const ContextSplit& split,
                              const ProcessGroup& group, ContextTraffic* traffic) {
  check_group(split, group);
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
      group.all_gather(local + (b * len + offset) * row, whole + b * split.seq() * row, counts, displs);
      offset += split.spans(me)[which].size();
      if (traffic != nullptr) traffic->gathered_bytes += received_elements(counts, me) * int64_t(sizeof(T));
    }
  }
}

// Per sequence, every rank's first chunk lies in rank order and is one reduce-scatter; the second
// chunks lie in reverse rank order, and are put in rank order in place (their region reversed, then
// each chunk reversed back) for the second.
template <class T>
void context_reduce_sequences(T* local, T* whole, int64_t batch, int64_t row, const ContextSplit& split,
                              const ProcessGroup& group, ContextTraffic* traffic) {
  check_group(split, group);
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
void context_attention_forward_gathered(T* out, T* lse, const T* q, const T* k_whole, const T* v_whole,
                                        const AttentionSizes& local, const ContextSplit& split, int rank,
                                        const int32_t* selection, int64_t topk) {
  check_sizes(split, rank, local, split.seq());
  const int64_t len = local.q_len, seq = split.seq(), heads = local.q_heads;
  const int64_t q_row = heads * local.head_dim, out_row = heads * local.value_dim();
  const std::array<ContextSplit::Span, 2> spans = split.spans(rank);
  Buffer<T> chunk_lse(heads * std::max(spans[0].size(), spans[1].size()));  // [heads, chunk]
  for (int64_t b = 0; b < local.batch; ++b) {
    int64_t offset = 0;
    for (const ContextSplit::Span& span : spans) {
      const AttentionSizes sizes = chunk_sizes(local, span, b, offset);
      const T* k = k_whole + b * seq * key_row(local);    // [seq, kv_heads, head_dim]
      const T* v = v_whole + b * seq * value_row(local);  // [seq, kv_heads, v_dim]
      if (selection != nullptr)
        sparse_attention_forward(out + (b * len + offset) * out_row, chunk_lse.data(), q + (b * len + offset) * q_row,
                                 k, v, selection + (b * len + offset) * topk, sparse_chunk_sizes(sizes, topk));
      else
        attention_forward(out + (b * len + offset) * out_row, chunk_lse.data(), q + (b * len + offset) * q_row, k, v,
                          sizes);
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(chunk_lse.data() + h * span.size(), span.size(), lse + (b * heads + h) * len + offset);
      offset += span.size();
    }
  }
}

template <class T>
void context_attention_backward_gathered(T* dq, T* dk_whole, T* dv_whole, const T* dout, const T* q, const T* k_whole,
                                         const T* v_whole, const T* out, const T* lse, const AttentionSizes& local,
                                         const ContextSplit& split, int rank, const int32_t* selection,
                                         int64_t topk) {
  check_sizes(split, rank, local, split.seq());
  const int64_t len = local.q_len, seq = split.seq(), heads = local.q_heads;
  const int64_t q_row = heads * local.head_dim, out_row = heads * local.value_dim();
  const int64_t k_row = key_row(local), v_row = value_row(local);
  const std::array<ContextSplit::Span, 2> spans = split.spans(rank);
  // The earlier chunk's terms [its end, k_row / v_row], added to the later chunk's.
  Buffer<T> early_dk(spans[0].end * k_row), early_dv(spans[0].end * v_row);
  Buffer<T> chunk_lse(heads * std::max(spans[0].size(), spans[1].size()));  // [heads, chunk]
  const int64_t offsets[2] = {0, spans[0].size()};
  for (int64_t b = 0; b < local.batch; ++b) {
    T* dk_sequence = dk_whole + b * seq * k_row;  // [seq, k_row]
    T* dv_sequence = dv_whole + b * seq * v_row;  // [seq, v_row]
    std::fill(dk_sequence + spans[1].end * k_row, dk_sequence + seq * k_row, T(0));
    std::fill(dv_sequence + spans[1].end * v_row, dv_sequence + seq * v_row, T(0));
    for (int s : {1, 0}) {  // the later chunk writes its keys' rows; the earlier one's are added
      const ContextSplit::Span& span = spans[s];
      const int64_t offset = offsets[s];
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(lse + (b * heads + h) * len + offset, span.size(), chunk_lse.data() + h * span.size());
      const AttentionSizes sizes = chunk_sizes(local, span, b, offset);
      T* dk = s == 1 ? dk_sequence : early_dk.data();
      T* dv = s == 1 ? dv_sequence : early_dv.data();
      const int64_t first = b * len + offset;  // the chunk's first local token
      if (selection != nullptr)
        sparse_attention_backward(dq + first * q_row, dk, dv, dout + first * out_row, q + first * q_row,
                                  k_whole + b * seq * k_row, v_whole + b * seq * v_row, out + first * out_row,
                                  chunk_lse.data(), selection + first * topk, sparse_chunk_sizes(sizes, topk));
      else
        attention_backward(dq + first * q_row, dk, dv, dout + first * out_row, q + first * q_row,
                           k_whole + b * seq * k_row, v_whole + b * seq * v_row, out + first * out_row,
                           chunk_lse.data(), sizes);
    }
    for (int64_t i = 0; i < spans[0].end * k_row; ++i) dk_sequence[i] += early_dk[i];
    for (int64_t i = 0; i < spans[0].end * v_row; ++i) dv_sequence[i] += early_dv[i];
  }
}

template <class T>
void context_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionSizes& local,
                               const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic,
                               const int32_t* selection, int64_t topk) {
  check_sizes(split, group.rank(), local, split.local_len(group.rank()));
  Buffer<T> keys(local.batch * split.seq() * key_row(local));      // [batch, seq, kv_heads, head_dim]
  Buffer<T> values(local.batch * split.seq() * value_row(local));  // [batch, seq, kv_heads, v_dim]
  context_gather_sequences(keys.data(), k, local.batch, key_row(local), split, group, traffic);
  context_gather_sequences(values.data(), v, local.batch, value_row(local), split, group, traffic);
  AttentionSizes gathered = local;
  gathered.kv_len = split.seq();
  context_attention_forward_gathered(out, lse, q, keys.data(), values.data(), gathered, split, group.rank(), selection,
                                     topk);
}

template <class T>
void context_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                const T* lse, const AttentionSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic, const int32_t* selection,
                                int64_t topk) {
  check_sizes(split, group.rank(), local, split.local_len(group.rank()));
  const int64_t k_row = key_row(local), v_row = value_row(local), rows = local.batch * split.seq();
  Buffer<T> keys(rows * k_row), values(rows * v_row);    // [batch, seq, k_row / v_row], gathered again
  Buffer<T> dkeys(rows * k_row), dvalues(rows * v_row);  // this rank's terms of their gradients
  context_gather_sequences(keys.data(), k, local.batch, k_row, split, group, traffic);
  context_gather_sequences(values.data(), v, local.batch, v_row, split, group, traffic);
  AttentionSizes gathered = local;
  gathered.kv_len = split.seq();
  context_attention_backward_gathered(dq, dkeys.data(), dvalues.data(), dout, q, keys.data(), values.data(), out, lse,
                                      gathered, split, group.rank(), selection, topk);
  context_reduce_sequences(dk, dkeys.data(), local.batch, k_row, split, group, traffic);
  context_reduce_sequences(dv, dvalues.data(), local.batch, v_row, split, group, traffic);
}

// context_attention_forward_gathered: the chunk's lse and the kernel's (dense, or sparse over topk
// selected keys) temporaries for the larger chunk; context_attention_backward_gathered: the earlier
// chunk's key and value terms too.
Workspace ContextSplitPlan::gathered_attention(const AttentionSizes& local, int64_t topk, bool bf16_rows, int threads,
                                               int64_t element_bytes) const {
  const std::array<ContextSplit::Span, 2> spans = split_.spans(rank_);
  const int64_t e = element_bytes, row = key_row(local) + value_row(local);  // a token's key and value
  const int64_t chunk_lse = local.q_heads * std::max(spans[0].size(), spans[1].size()) * e;
  int64_t kernel_forward = 0, kernel_backward = 0;
  for (const ContextSplit::Span& span : spans) {
    const AttentionSizes sizes = chunk_sizes(local, span, 0, 0);
    const SparseAttentionSizes sparse = sparse_chunk_sizes(sizes, topk);
    kernel_forward =
        std::max(kernel_forward, topk > 0 ? sparse_attention_forward_workspace_bytes(sparse, threads, e, bf16_rows)
                                          : attention_forward_workspace_bytes(sizes, threads, e));
    kernel_backward =
        std::max(kernel_backward, topk > 0 ? sparse_attention_backward_workspace_bytes(sparse, threads, e, bf16_rows)
                                           : attention_backward_workspace_bytes(sizes, threads, e));
  }
  return {.forward = chunk_lse + kernel_forward, .backward = spans[0].end * row * e + chunk_lse + kernel_backward};
}

ContextPassTraffic ContextSplitPlan::gathered_rows(int64_t batch, int64_t row, int64_t element_bytes) const {
  return context_gathered_rows_traffic(split_, rank_, batch, row, element_bytes);
}

ContextCost ContextSplitPlan::conv1d_silu(const Conv1dSizes& local, int64_t element_bytes) const {
  return context_conv1d_cost(split_, rank_, local, element_bytes);
}

ContextCost ContextSplitPlan::delta_rule(const DeltaRuleSizes& local, int threads, int64_t element_bytes) const {
  return context_delta_rule_cost(split_, rank_, local, threads, element_bytes);
}

ContextParallel::ContextParallel(const ProcessGroup& group, int64_t seq, const char* flag)
    : group_(group), split_(seq, group.size(), flag), positions_(split_.positions(group.rank())) {}

// Per sequence and chunk, its last token and the latest document start its own tokens reveal (after
// an eos inside it; −1: none) are all-gathered; each rank then walks the chunks in order.
void ContextParallel::document_starts(int32_t* doc_start, const int32_t* tokens, int64_t batch, int32_t eos) {
  const int me = group_.rank();
  const int64_t chunks = 2 * int64_t(split_.ranks()), len = split_.local_len(me);
  const std::array<ContextChunk, 2> own = this->chunks();
  Buffer<double> slots(batch * chunks * 2);  // [batch, chunks, 2]: last token, latest inner start
  for (int64_t b = 0; b < batch; ++b)
    for (int which : {0, 1}) {
      const ContextChunk& c = own[which];
      const int32_t* row = tokens + b * len + c.offset;  // [chunk]
      int64_t inner = -1;
      for (int64_t t = 1; t < c.size(); ++t)
        if (row[t - 1] == eos) inner = c.begin + t;
      const int64_t chunk = which == 0 ? me : chunks - 1 - me;
      slots[(b * chunks + chunk) * 2] = row[c.size() - 1];
      slots[(b * chunks + chunk) * 2 + 1] = double(inner);
    }
  gather_chunk_slots(slots.data(), batch, 2, split_, group_, nullptr);
  for (int64_t b = 0; b < batch; ++b) {
    const double* slot = slots.data() + b * chunks * 2;  // [chunks, 2]
    int64_t start = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const ContextSplit::Span span = split_.chunk(int(chunk));
      if (chunk > 0 && int32_t(slot[(chunk - 1) * 2]) == eos) start = span.begin;
      const int which = chunk == me ? 0 : chunk == chunks - 1 - me ? 1 : -1;
      if (which < 0) {
        start = std::max<int64_t>(start, int64_t(slot[chunk * 2 + 1]));
        continue;
      }
      const ContextChunk& c = own[which];
      const int32_t* row = tokens + b * len + c.offset;  // [chunk]
      for (int64_t t = 0; t < c.size(); ++t) {
        if (t > 0 && row[t - 1] == eos) start = c.begin + t;
        doc_start[b * len + c.offset + t] = int32_t(start);
      }
    }
  }
}

const int32_t* ContextParallel::positions(int64_t seq) const {
  TRILLION_CHECK(seq == int64_t(positions_.size()), "context parallelism: rank ", group_.rank(), " holds ",
                 positions_.size(), " tokens of each ", split_.seq(), "-token sequence, the batch has ", seq);
  return positions_.data();
}

// The float and double overrides of the gathered rows and the attention over them, written once.
#define TRILLION_CONTEXT_GATHERED(T)                                                                                 \
  void ContextParallel::gather_sequences(T* whole, const T* local, int64_t batch, int64_t row) {                     \
    context_gather_sequences(whole, local, batch, row, split_, group_, &traffic_);                                   \
  }                                                                                                                 \
  void ContextParallel::reduce_sequences(T* local, T* whole, int64_t batch, int64_t row) {                           \
    context_reduce_sequences(local, whole, batch, row, split_, group_, &traffic_);                                   \
  }                                                                                                                 \
  void ContextParallel::gathered_attention_forward(T* out, T* lse, const T* q, const T* k_whole, const T* v_whole,  \
                                                   const int32_t* selection, int64_t topk,                          \
                                                   const AttentionSizes& local) {                                   \
    context_attention_forward_gathered(out, lse, q, k_whole, v_whole, local, split_, group_.rank(), selection,       \
                                       topk);                                                                       \
  }                                                                                                                 \
  void ContextParallel::gathered_attention_backward(T* dq, T* dk_whole, T* dv_whole, const T* dout, const T* q,     \
                                                    const T* k_whole, const T* v_whole, const T* out, const T* lse, \
                                                    const int32_t* selection, int64_t topk,                         \
                                                    const AttentionSizes& local) {                                  \
    context_attention_backward_gathered(dq, dk_whole, dv_whole, dout, q, k_whole, v_whole, out, lse, local, split_, \
                                        group_.rank(), selection, topk);                                            \
  }
TRILLION_CONTEXT_GATHERED(float)
TRILLION_CONTEXT_GATHERED(double)
#undef TRILLION_CONTEXT_GATHERED

// The float and double overrides of the convolution and the delta rule, written once.
#define TRILLION_CONTEXT_LINEAR_ATTENTION(T)                                                                        \
  void ContextParallel::conv1d_silu_forward(T* y, const T* x, const T* w, const int32_t* doc_start,                 \
                                            const Conv1dSizes& local) {                                            \
    context_conv1d_silu_forward(y, x, w, doc_start, local, split_, group_, &traffic_);                              \
  }                                                                                                                 \
  void ContextParallel::conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w,                     \
                                             const int32_t* doc_start, const Conv1dSizes& local) {                  \
    context_conv1d_silu_backward(dx, dw, dy, x, w, doc_start, local, split_, group_, &traffic_);                    \
  }                                                                                                                 \
  void ContextParallel::delta_rule_forward(T* o, const T* q, const T* k, const T* v, const T* g, const T* beta,     \
                                           const int32_t* doc_start, const DeltaRuleSizes& local) {                 \
    Buffer<T> summaries(context_delta_rule_summary_count(split_, local)); /* formed again by the backward */        \
    context_delta_rule_forward(o, summaries.data(), q, k, v, g, beta, doc_start, local, split_, group_, &traffic_); \
  }                                                                                                                 \
  void ContextParallel::delta_rule_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* d_o, const T* q,        \
                                            const T* k, const T* v, const T* g, const T* beta,                      \
                                            const int32_t* doc_start, const DeltaRuleSizes& local) {                \
    context_delta_rule_backward(dq, dk, dv, dg, dbeta, d_o, q, k, v, g, beta, static_cast<const T*>(nullptr),      \
                                doc_start, local, split_, group_, &traffic_);                                       \
  }
TRILLION_CONTEXT_LINEAR_ATTENTION(float)
TRILLION_CONTEXT_LINEAR_ATTENTION(double)
#undef TRILLION_CONTEXT_LINEAR_ATTENTION

#define TRILLION_INSTANTIATE(T)                                                                                       \
  template void gather_chunk_slots<T>(T*, int64_t, int64_t, const ContextSplit&, const ProcessGroup&,                 \
                                      ContextTraffic*);                                                               \
  template void context_gather_sequences<T>(T*, const T*, int64_t, int64_t, const ContextSplit&, const ProcessGroup&, \
                                            ContextTraffic*);                                                         \
  template void context_reduce_sequences<T>(T*, T*, int64_t, int64_t, const ContextSplit&, const ProcessGroup&,       \
                                            ContextTraffic*);                                                         \
  template void context_attention_forward_gathered<T>(T*, T*, const T*, const T*, const T*, const AttentionSizes&,    \
                                                      const ContextSplit&, int, const int32_t*, int64_t);             \
  template void context_attention_backward_gathered<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,  \
                                                       const T*, const AttentionSizes&, const ContextSplit&, int,     \
                                                       const int32_t*, int64_t);                                      \
  template void context_attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionSizes&,             \
                                             const ContextSplit&, const ProcessGroup&, ContextTraffic*,               \
                                             const int32_t*, int64_t);                                                \
  template void context_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                              const AttentionSizes&, const ContextSplit&, const ProcessGroup&,        \
                                              ContextTraffic*, const int32_t*, int64_t);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
