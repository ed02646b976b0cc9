// What `trillion bench context-parallel` (bench/context_parallel_bench.h) measures of every mixer
// kind (context_parallel_bench.cpp, and context_parallel_mla.cpp for MLA): the inputs drawn once over the whole
// sequences and each rank's tokens taken from them, the split forward + backward timed and its traffic and peak
// counted, the error against one rank's plain kernels over the whole sequences, and the summary over the ranks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/context_parallel_bench.h"
#include "bench/timing.h"
#include "core/memory.h"
#include "model/memory_sizes.h"
#include "ops/indexer.h"
#include "parallel/context_parallel.h"
#include "parallel/process_group.h"

namespace trillion {

// dst[batch, positions, row] ← src[batch, seq, row] at the positions.
template <class T>
void take_rows(T* dst, const T* src, int64_t batch, int64_t seq, int64_t row, const std::vector<int32_t>& positions) {
  const int64_t len = static_cast<int64_t>(positions.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < len; ++j) std::copy_n(src + (b * seq + positions[j]) * row, row, dst + (b * len + j) * row);
}

// max|a − b| / max|b| over the local rows, b taken from the whole sequences at the positions.
template <class T>
double rel_err(const Buffer<T>& local, const Buffer<T>& whole, int64_t batch, int64_t seq, int64_t row,
               const std::vector<int32_t>& positions) {
  Buffer<T> expected(local.size());
  take_rows(expected.data(), whole.data(), batch, seq, row, positions);
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < local.size(); ++i) {
    diff = std::max(diff, std::abs(double(local[i]) - double(expected[i])));
    scale = std::max(scale, std::abs(double(expected[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// max|a − b| / max|b| of a gradient whose every rank holds its own terms (mine: this rank's, summed
// over the ranks first) against one rank's over the whole sequences, compared as one row.
template <class T>
double summed_error(const Buffer<T>& mine, const Buffer<T>& whole, const ProcessGroup& world) {
  std::vector<double> sum(mine.data(), mine.data() + mine.size());  // [mine.size()] over the ranks
  world.all_reduce_sum(sum.data(), int64_t(sum.size()));
  Buffer<T> summed(mine.size());  // as mine
  for (int64_t i = 0; i < summed.size(); ++i) summed[i] = T(sum[i]);
  return rel_err(summed, whole, 1, 1, summed.size(), {0});
}

// What one rank measured of a mixer's split forward and backward, and what the formula plans.
struct RankMeasure {
  double err = 0.0;           // max rel err against one rank over the whole sequences
  int64_t peak = 0;           // local tensors plus the temporaries' peak
  int64_t one_rank_peak = 0;  // the same for one rank over the whole sequences
  ContextTraffic forward, backward;
  ContextPassTraffic plan;
  std::vector<double> seconds;           // each run's forward + backward
  std::vector<double> one_rank_seconds;  // on one rank: the plain kernels' over the whole sequences
};

// The summary over the ranks: the slowest rank's time per run, the largest error, peak and traffic.
nlohmann::json summarize_ranks(const RankMeasure& m, const ProcessGroup& world);

// Runs step `runs` times after one counted run (its traffic and peak), every run timed from a barrier.
// On one rank the whole sequences' plain kernels (`reference`) are timed too, alternating with it.
template <class Step, class Reference>
void measure(RankMeasure& m, int64_t local_bytes, int runs, const ProcessGroup& world, const Step& step,
             const Reference& reference) {
  m.peak = local_bytes + peak_extra_bytes([&] { step(&m.forward, &m.backward); });
  const auto seconds_of = [](const auto& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int r = 0; r < runs; ++r) {
    world.barrier();
    m.seconds.push_back(seconds_of([&] { step(nullptr, nullptr); }));
    if (world.size() == 1) m.one_rank_seconds.push_back(seconds_of(reference));
  }
}

// Documents start where (position + 7 · row) is a multiple of doc_len, so they cross chunks:
// [batch, seq] each token's document start.
std::vector<int32_t> document_starts(int64_t batch, int64_t seq, int64_t doc_len);

// The documents as packed segments over the batch · seq tokens, [segments + 1] (empty: no masks).
std::vector<int32_t> document_segments(const std::vector<int32_t>& doc_start, int64_t seq);

// The lightning indexer's inputs of some tokens (ops/indexer.h): q_I [tokens, H_I, d_I], k_I
// [tokens, d_I], w_I [tokens, H_I], and the selection [tokens, topk].
template <class T>
struct IndexerInputs {
  Buffer<T> q, k, w;
  Buffer<int32_t> selection;
  IndexerInputs(int64_t tokens, const ContextParallelBenchOptions& o)
      : q(tokens * o.index_heads * o.index_dim),
        k(tokens * o.index_dim),
        w(tokens * o.index_heads),
        selection(tokens * o.topk) {}
  int64_t bytes() const { return int64_t(sizeof(T)) * (q.size() + k.size() + w.size()) + 4 * selection.size(); }
};

// doc_start: document masks [batch, q_len] (key positions), or null.
inline IndexerSizes indexer_sizes(const ContextParallelBenchOptions& o, int64_t batch, int64_t q_len, int64_t kv_len,
                                  const int32_t* doc_start) {
  return {batch, q_len, kv_len, o.index_heads, o.index_dim, o.topk, 1.0 / std::sqrt(double(o.index_dim)), doc_start};
}

// The split selection, as the model's sparse layers make it: this rank's queries (local: its
// tokens of each sequence) select their top-k over every earlier position of their sequences,
// chunk by chunk against the whole sequences' keys up to the chunk's end (index_keys [batch, seq,
// d_I], gathered from the group), so the selection holds global positions; doc_start [batch, its
// tokens] (global positions) or null.
template <class T>
void select_split(IndexerInputs<T>& local, const T* index_keys, const ContextParallelBenchOptions& o,
                  const ContextSplit& split, int rank, const int32_t* doc_start) {
  const int64_t len = split.local_len(rank), hd = o.index_heads * o.index_dim;
  for (int64_t b = 0; b < o.batch; ++b)
    for (const ContextChunk& c : split.local_chunks(rank)) {
      const int64_t first = b * len + c.offset;  // the chunk's first local token
      indexer_topk(local.selection.data() + first * o.topk, local.q.data() + first * hd,
                   index_keys + b * split.seq() * o.index_dim, local.w.data() + first * o.index_heads,
                   indexer_sizes(o, 1, c.size(), c.end, doc_start != nullptr ? doc_start + first : nullptr));
    }
}

// MLA (model/mla_absorbed.h): its absorbed form over the gathered rows against one rank's expanded
// form (bench/context_parallel_mla.cpp).
RankMeasure run_mla_context(const ContextParallelBenchOptions& o, const ContextSplit& split, const ProcessGroup& world);

}  // namespace trillion
