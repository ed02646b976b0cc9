// The short convolution across a context-parallel split. See context_conv1d.h.
#include "parallel/context_conv1d.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/memory.h"

namespace trillion {
namespace {

// This rank's chunks as the kernel's packed segments: per sequence and chunk, its halo rows then its
// own, cut where a document starts.
struct Segments {
  int64_t halo = 0;                 // W − 1
  std::vector<int32_t> cu_seqlens;  // [segments + 1] over the extended tokens
  std::vector<int64_t> first;       // [B, 2]: each chunk's first extended row (its halo's first)
  std::vector<int64_t> halo_rows;   // [B, 2]: min(W − 1, the chunk's first position)
  int64_t rows = 0;                 // extended rows
  Segments(const ContextSplit& split, int rank, int64_t batch, int64_t width, const int32_t* doc_start)
      : halo(width - 1) {
    const int64_t len = split.local_len(rank);
    cu_seqlens.push_back(0);
    const auto cut = [&](int64_t row) {
      if (row > cu_seqlens.back()) cu_seqlens.push_back(int32_t(row));
    };
    for (int64_t b = 0; b < batch; ++b) {
      int64_t base = b * len;  // the chunk's first local token
      for (const ContextSplit::Span& span : split.spans(rank)) {
        const int64_t h = std::min(halo, span.begin), at = rows + h;  // the chunk's first own row
        cut(rows);
        first.push_back(rows);
        halo_rows.push_back(h);
        if (doc_start != nullptr && doc_start[base] > span.begin - h) cut(at - (span.begin - doc_start[base]));
        for (int64_t j = 1; j < span.size(); ++j)
          if (doc_start != nullptr && doc_start[base + j] == span.begin + j) cut(at + j);
        rows = at + span.size();
        base += span.size();
      }
    }
    cut(rows);
  }
  Conv1dSizes sizes(const Conv1dSizes& local) const {
    Conv1dSizes s = local;
    s.batch = 1;
    s.seq_len = rows;
    s.num_segments = int64_t(cu_seqlens.size()) - 1;
    return s;
  }
};

// The extended rows [rows, C]: each chunk's halo from the gathered tails, then its own inputs.
template <class T>
Buffer<T> extended_rows(const T* x, const Segments& seg, const Conv1dSizes& local, const ContextSplit& split,
                        const ProcessGroup& group, ContextTraffic* traffic) {
  const int me = group.rank();
  const int64_t C = local.channels, h = seg.halo, batch = local.batch, len = split.local_len(me);
  const int64_t chunks = 2 * int64_t(split.ranks());
  // [B, chunks, h, C]: each chunk's last h inputs, right-aligned (row r: position end − h + r).
  Buffer<T> tails(batch * chunks * h * C);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t base = b * len;
    for (int s = 0; s < 2; ++s) {
      const ContextSplit::Span span = split.spans(me)[s];
      const int64_t c = s == 0 ? me : chunks - 1 - me, kept = std::min(h, span.size());
      std::copy_n(x + (base + span.size() - kept) * C, kept * C, tails.data() + ((b * chunks + c) * h + h - kept) * C);
      base += span.size();
    }
  }
  gather_chunk_slots(tails.data(), batch, h * C, split, group, traffic);
  Buffer<T> rows(seg.rows * C);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t base = b * len;
    for (int s = 0; s < 2; ++s) {
      const ContextSplit::Span span = split.spans(me)[s];
      const int64_t i = b * 2 + s, first = seg.first[i], hr = seg.halo_rows[i];
      for (int64_t r = 0; r < hr; ++r) {  // position span.begin − hr + r, in the chunk cc that holds it
        const int64_t p = span.begin - hr + r;
        int64_t cc = 0;
        while (split.chunk(int(cc)).end <= p) ++cc;
        const int64_t row = h - (split.chunk(int(cc)).end - p);
        std::copy_n(tails.data() + ((b * chunks + cc) * h + row) * C, C, rows.data() + (first + r) * C);
      }
      std::copy_n(x + base * C, span.size() * C, rows.data() + (first + hr) * C);
      base += span.size();
    }
  }
  return rows;
}

}  // namespace

ContextPassTraffic context_conv1d_traffic(const ContextSplit& split, const Conv1dSizes& local,
                                               int64_t element_bytes) {
  const int64_t slots = int64_t(split.ranks() - 1) * local.batch * 2 * (local.width - 1) * local.channels;
  return {{slots * element_bytes, 0}, {2 * slots * element_bytes, 0}};
}

// Forward: the tails beside the extended rows (extended_rows), then the rows beside the outputs.
// Backward: the same gather, then the rows, their output gradients and their gradients with the
// kernel's temporaries, then with the halos' gradients (the tails' size).
ContextCost context_conv1d_cost(const ContextSplit& split, int rank, const Conv1dSizes& local, int64_t element_bytes) {
  const int64_t h = local.width - 1, C = local.channels, e = element_bytes;
  int64_t rows = 0;  // extended rows (documents cut segments, not rows)
  for (const ContextSplit::Span& span : split.spans(rank)) rows += std::min(h, span.begin) + span.size();
  rows *= local.batch;
  const int64_t tails = local.batch * 2 * int64_t(split.ranks()) * h * C * e, extended = rows * C * e;
  const ContextPassTraffic traffic = context_conv1d_traffic(split, local, e);
  return {
      .workspace = {.forward = std::max(tails + extended, 2 * extended),
                    .backward = std::max(
                        tails + extended,
                        3 * extended + std::max(conv1d_silu_backward_workspace_bytes(rows, C, local.width, e), tails))},
      .received = traffic.both()};
}

template <class T>
void context_conv1d_silu_forward(T* y, const T* x, const T* w, const int32_t* doc_start, const Conv1dSizes& local,
                                 const ContextSplit& split, const ProcessGroup& group, ContextTraffic* traffic) {
  TRILLION_CHECK(group.size() == split.ranks() && local.seq_len == split.local_len(group.rank()),
                 "context conv1d: rank ", group.rank(), " holds ", split.local_len(group.rank()),
                 " tokens per sequence, sizes give ", local.seq_len);
  const Segments seg(split, group.rank(), local.batch, local.width, doc_start);
  const int64_t C = local.channels, len = local.seq_len;
  const Buffer<T> rows = extended_rows(x, seg, local, split, group, traffic);  // [rows, C]
  Buffer<T> out(seg.rows * C);                                                 // [rows, C]
  conv1d_silu_forward(out.data(), rows.data(), w, seg.cu_seqlens.data(), seg.sizes(local));
  for (int64_t b = 0; b < local.batch; ++b) {
    int64_t base = b * len;
    for (int s = 0; s < 2; ++s) {
      const int64_t i = b * 2 + s, size = split.spans(group.rank())[s].size();
      std::copy_n(out.data() + (seg.first[i] + seg.halo_rows[i]) * C, size * C, y + base * C);
      base += size;
    }
  }
}

template <class T>
void context_conv1d_silu_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* doc_start,
                                  const Conv1dSizes& local, const ContextSplit& split, const ProcessGroup& group,
                                  ContextTraffic* traffic) {
  const int me = group.rank();
  TRILLION_CHECK(group.size() == split.ranks() && local.seq_len == split.local_len(me), "context conv1d: rank ", me,
                 " holds ", split.local_len(me), " tokens per sequence, sizes give ", local.seq_len);
  const Segments seg(split, me, local.batch, local.width, doc_start);
  const int64_t C = local.channels, len = local.seq_len, h = seg.halo, chunks = 2 * int64_t(split.ranks());
  const Buffer<T> rows = extended_rows(x, seg, local, split, group, traffic);  // [rows, C]
  Buffer<T> d_out(seg.rows * C), d_rows(seg.rows * C);                         // [rows, C]; the halo's d_out 0
  for (int64_t b = 0; b < local.batch; ++b) {
    int64_t base = b * len;
    for (int s = 0; s < 2; ++s) {
      const int64_t i = b * 2 + s, size = split.spans(me)[s].size();
      std::copy_n(dy + base * C, size * C, d_out.data() + (seg.first[i] + seg.halo_rows[i]) * C);
      base += size;
    }
  }
  conv1d_silu_backward(d_rows.data(), dw, d_out.data(), rows.data(), w, seg.cu_seqlens.data(), seg.sizes(local));
  // Own rows' gradients; each chunk's halo gradients [B, chunks, h, C] (row r: position begin − h + r).
  Buffer<T> halo_grads(local.batch * chunks * h * C);
  for (int64_t b = 0; b < local.batch; ++b) {
    int64_t base = b * len;
    for (int s = 0; s < 2; ++s) {
      const ContextSplit::Span span = split.spans(me)[s];
      const int64_t i = b * 2 + s, hr = seg.halo_rows[i], c = s == 0 ? me : chunks - 1 - me;
      std::copy_n(d_rows.data() + (seg.first[i] + hr) * C, span.size() * C, dx + base * C);
      std::copy_n(d_rows.data() + seg.first[i] * C, hr * C, halo_grads.data() + ((b * chunks + c) * h + h - hr) * C);
      base += span.size();
    }
  }
  gather_chunk_slots(halo_grads.data(), local.batch, h * C, split, group, traffic);
  // Every later chunk whose halo reaches one of this rank's tokens adds its gradient there, in chunk order.
  for (int64_t b = 0; b < local.batch; ++b) {
    int64_t base = b * len;
    for (const ContextSplit::Span& span : split.spans(me)) {
      for (int64_t c = 0; c < chunks; ++c) {
        const ContextSplit::Span later = split.chunk(int(c));
        for (int64_t p = std::max(span.begin, later.begin - h); p < std::min(span.end, later.begin); ++p) {
          const T* g = halo_grads.data() + ((b * chunks + c) * h + (p - (later.begin - h))) * C;
          T* d = dx + (base + p - span.begin) * C;
          for (int64_t ch = 0; ch < C; ++ch) d[ch] += g[ch];
        }
      }
      base += span.size();
    }
  }
}

template void context_conv1d_silu_forward<float>(float*, const float*, const float*, const int32_t*, const Conv1dSizes&,
                                                 const ContextSplit&, const ProcessGroup&, ContextTraffic*);
template void context_conv1d_silu_forward<double>(double*, const double*, const double*, const int32_t*,
                                                  const Conv1dSizes&, const ContextSplit&, const ProcessGroup&,
                                                  ContextTraffic*);
template void context_conv1d_silu_backward<float>(float*, float*, const float*, const float*, const float*,
                                                  const int32_t*, const Conv1dSizes&, const ContextSplit&,
                                                  const ProcessGroup&, ContextTraffic*);
template void context_conv1d_silu_backward<double>(double*, double*, const double*, const double*, const double*,
                                                   const int32_t*, const Conv1dSizes&, const ContextSplit&,
                                                   const ProcessGroup&, ContextTraffic*);

}  // namespace trillion
