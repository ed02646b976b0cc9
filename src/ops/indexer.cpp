// The lightning indexer's streamed top-k and its KL loss (forward and backward), see indexer.h.
//
// Score tiles: a work item owns one (batch, query block of kQueryBlock queries). For a key block
// of kKeyBlock keys one gemm gives head_scores[rows = (query, head), keys] = scale · q kᵀ (the
// rows (t, h) of q are contiguous, so the query block is one matrix); ReLU and the weighted head
// sum (heads in increasing order) fold it into tile[query, key] = I. Keys a query cannot see are
// never read: each query row uses only its visible span of a block's columns (a prefix, or with
// document masks a middle range). Key blocks wholly before every document start of a query block
// are skipped.
//
// Top-k (streaming): each query keeps a candidate list of up to 2·topk + kKeyBlock candidates,
// packed as integers whose order is "score descending, then key ascending". Keys arrive in
// increasing order, so once the list has been compacted to its best topk (select_largest), a later
// key can rank among the best only with a score strictly above the worst kept one; everything else
// is dropped on sight (whole blocks at once by their maximum). The list is compacted again when it
// holds more than 2·topk, and radix-sorted at the end. The order is total and strict, so the selection
// is unique: the result equals a full sort and does not depend on the thread count. The selection
// machinery (packing, quickselect, radix sort, running list) lives in ops/indexer_select.h.
//
// Loss, dense mode (two passes per query block): pass 1 streams the log-sum-exp of I over the
// visible keys; pass 2 recomputes I and the main attention's P_h = exp(scale_t · q kᵀ − lse_h)
// per key block (one gemm per kv-head group), accumulates KL, the selected mass (each query's
// selection sorted ascending, walked by a cursor as key blocks advance) and the best mass (each
// query's top-k largest p, streamed through the top-k's running list), forms dI and the
// gradients: dw and dq stay in the item, dk[keys of the block] gets the block's dSᵀ q. The dk
// adds are ordered by query block: a per-(batch, key block) turn counter makes an item wait until
// every earlier query block that sees the key block has added its part (items are claimed in
// increasing order, so the one waited for is running or done; with document masks, the query
// blocks that skip the key block are not waited for). Hence dk is bitwise independent of
// the thread count, with O(threads · block) workspace and no recompute.
// Sparse mode: per query, the selected keys are gathered (indexer and main-attention keys), both
// distributions live on S_t (so the best mass is the selected one); items of kSparseQueryBlock
// queries keep their dk rows [queries, topk, d] and scatter them into dk in item order under one
// turn counter (same argument).
#include "ops/indexer.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/turns.h"
#include "ops/gemm.h"
#include "ops/indexer_select.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

using indexer_select::PackedRank;
using indexer_select::RunningTopk;

constexpr int64_t kQueryBlock = 64;        // queries per dense work item
constexpr int64_t kKeyBlock = 256;         // keys per score tile
constexpr int64_t kSparseQueryBlock = 16;  // queries per sparse-mode work item

// Index arithmetic and size checks shared by the top-k and the loss.
struct Geometry {
  IndexerSizes s;
  int64_t offset, q_blocks, k_blocks, rows_max;
  explicit Geometry(const IndexerSizes& sizes) : s(sizes) {
    TRILLION_CHECK(s.batch > 0 && s.q_len > 0 && s.heads > 0 && s.head_dim > 0 && s.topk > 0,
                   "bad indexer sizes batch=", s.batch, " q_len=", s.q_len, " heads=", s.heads,
                   " head_dim=", s.head_dim, " topk=", s.topk);
    TRILLION_CHECK(s.q_len <= s.kv_len, "indexer q_len ", s.q_len, " > kv_len ", s.kv_len);
    TRILLION_CHECK(s.kv_len <= std::numeric_limits<int32_t>::max(), "indexer kv_len ", s.kv_len, " exceeds int32");
    offset = s.kv_len - s.q_len;
    for (int64_t i = 0; s.doc_start != nullptr && i < s.batch * s.q_len; ++i)
      TRILLION_CHECK(s.doc_start[i] >= 0 && s.doc_start[i] <= offset + i % s.q_len, "indexer doc_start[", i / s.q_len,
                     ", ", i % s.q_len, "] = ", s.doc_start[i], " is not a key position in [0, ", offset + i % s.q_len,
                     "]");
    q_blocks = (s.q_len + kQueryBlock - 1) / kQueryBlock;
    k_blocks = (s.kv_len + kKeyBlock - 1) / kKeyBlock;
    rows_max = kQueryBlock * s.heads;
  }
  // Keys [visible_begin(b, t), visible_end(t)) are visible to query t of batch entry b.
  int64_t visible_begin(int64_t b, int64_t t) const { return s.doc_start != nullptr ? s.doc_start[b * s.q_len + t] : 0; }
  int64_t visible_end(int64_t t) const { return t + offset + 1; }
  // The first key block that a query of [t0, t1) sees.
  int64_t first_key_block(int64_t b, int64_t t0, int64_t t1) const {
    int64_t begin = visible_begin(b, t0);
    for (int64_t t = t0 + 1; t < t1; ++t) begin = std::min(begin, visible_begin(b, t));
    return begin / kKeyBlock;
  }
  // The columns [lo, hi) of key block [j0, j0 + cols) visible to query t (lo == hi: none).
  struct Span {
    int64_t lo, hi;
    int64_t size() const { return hi - lo; }
  };
  Span visible_in_block(int64_t b, int64_t t, int64_t j0, int64_t cols) const {
    const int64_t hi = std::clamp<int64_t>(visible_end(t) - j0, 0, cols);
    return {std::clamp<int64_t>(visible_begin(b, t) - j0, 0, hi), hi};
  }
  const int32_t* index_row(const int32_t* indices, int64_t b, int64_t t) const {
    return indices + (b * s.q_len + t) * s.topk;
  }
};

template <class T>
T relu(T x) {
  return x < T(0) ? T(0) : x;  // NaN passes through, so a NaN input shows up in the score
}

// head_scores[(t − t0)·heads + h, c] ← scale · q[b, t, h] · k[b, j0 + c] and
// tile[t − t0, c] ← Σ_h w[b, t, h] · ReLU(head_scores) for t in [t0, t1), c < cols (ld kKeyBlock both).
// Entries beyond a query's visible keys are computed but must not be read.
template <class T>
void score_tile(T* tile, T* head_scores, const T* q, const T* k, const T* w, const Geometry& geo, int64_t b,
                int64_t t0, int64_t t1, int64_t j0, int64_t cols) {
  const int64_t heads = geo.s.heads, d = geo.s.head_dim;
  const T* q_block = q + (b * geo.s.q_len + t0) * heads * d;  // [(t1 − t0)·heads, d]
  const T* k_block = k + (b * geo.s.kv_len + j0) * d;         // [cols, d]
  gemm<T>(false, true, (t1 - t0) * heads, cols, d, T(geo.s.scale), q_block, d, k_block, d, T(0), head_scores,
          kKeyBlock);
  for (int64_t t = t0; t < t1; ++t) {
    T* row = tile + (t - t0) * kKeyBlock;  // [cols]
    const T* w_row = w + (b * geo.s.q_len + t) * heads;
    std::fill(row, row + cols, T(0));
    for (int64_t h = 0; h < heads; ++h) {
      const T* hs = head_scores + ((t - t0) * heads + h) * kKeyBlock;
      const T wh = w_row[h];
      for (int64_t c = 0; c < cols; ++c) row[c] += wh * relu(hs[c]);
    }
  }
}

// Elements of one thread's top-k workspace (T): head_scores [rows_max, kKeyBlock], tile [kQueryBlock, kKeyBlock].
int64_t topk_per_thread(const Geometry& geo) { return geo.rows_max * kKeyBlock + kQueryBlock * kKeyBlock; }

// Candidates of one thread (packed): lists [kQueryBlock, capacity] and the compaction's scratch
// [capacity], capacity = 2·topk + kKeyBlock.
int64_t topk_candidates_per_thread(const IndexerSizes& s) { return (kQueryBlock + 1) * (2 * s.topk + kKeyBlock); }

// Points running[0, queries) at this thread's candidate lists in `candidates` (laid out as
// topk_candidates_per_thread, per thread).
template <class T>
void attach_candidate_lists(RunningTopk<T>* running, int64_t queries, typename PackedRank<T>::Packed* candidates,
                            int thread, int64_t topk) {
  const int64_t capacity = 2 * topk + kKeyBlock;
  for (int64_t r = 0; r < queries; ++r) {
    running[r].list = candidates + (thread * (kQueryBlock + 1) + r) * capacity;
    running[r].scratch = candidates + (thread * (kQueryBlock + 1) + kQueryBlock) * capacity;
    running[r].topk = topk;
  }
}

// A packed candidate (the score's bits, then the key) takes two T's bytes.
static_assert(sizeof(PackedRank<float>::Packed) == 2 * sizeof(float) &&
              sizeof(PackedRank<double>::Packed) == 2 * sizeof(double));

}  // namespace

int64_t indexer_topk_workspace_bytes(const IndexerSizes& sizes, int threads, int64_t element_bytes) {
  const Geometry geo(sizes);
  return (topk_per_thread(geo) + 2 * topk_candidates_per_thread(sizes)) * threads * element_bytes;  // packed: 2 T
}

template <class T>
void indexer_topk(int32_t* indices, const T* q, const T* k, const T* w, const IndexerSizes& sizes) {
  const Geometry geo(sizes);
  const int64_t per_thread = topk_per_thread(geo);  // layout below
  Buffer<T> workspace(per_thread * num_threads());
  Buffer<typename PackedRank<T>::Packed> candidates(topk_candidates_per_thread(sizes) * num_threads());
  const int64_t items = sizes.batch * geo.q_blocks;

  parallel_for_dynamic(items, [&](int64_t item) {
    // Late query blocks (most keys) first for load balance.
    const int64_t qb = geo.q_blocks - 1 - item % geo.q_blocks, b = item / geo.q_blocks;
    const int thread = omp_get_thread_num();
    T* head_scores = workspace.data() + per_thread * thread;  // [rows_max, kKeyBlock]
    T* tile = head_scores + geo.rows_max * kKeyBlock;         // [kQueryBlock, kKeyBlock]
    const int64_t t0 = qb * kQueryBlock, t1 = std::min(t0 + kQueryBlock, sizes.q_len);
    RunningTopk<T> running[kQueryBlock];
    attach_candidate_lists(running, t1 - t0, candidates.data(), thread, sizes.topk);
    const int64_t key_end = geo.visible_end(t1 - 1);
    for (int64_t j0 = geo.first_key_block(b, t0, t1) * kKeyBlock; j0 < key_end; j0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, key_end - j0);
      score_tile(tile, head_scores, q, k, w, geo, b, t0, t1, j0, cols);
      for (int64_t t = t0; t < t1; ++t) {
        const Geometry::Span span = geo.visible_in_block(b, t, j0, cols);
        running[t - t0].offer(tile + (t - t0) * kKeyBlock + span.lo, span.size(), j0 + span.lo);
      }
    }
    for (int64_t t = t0; t < t1; ++t) running[t - t0].write(indices + (b * sizes.q_len + t) * sizes.topk);
  });
}

namespace {

// Sizes of the main attention target, checked against the indexer's.
struct TargetGeometry {
  IndexerTarget t;
  int64_t group, q_stride, kv_stride;
  TargetGeometry(const IndexerTarget& target, const IndexerSizes& s) : t(target) {
    TRILLION_CHECK(t.heads > 0 && t.kv_heads > 0 && t.qk_dim > 0 && t.heads % t.kv_heads == 0,
                   "bad indexer target heads=", t.heads, " kv_heads=", t.kv_heads, " qk_dim=", t.qk_dim);
    TRILLION_CHECK(t.q != nullptr && t.k != nullptr && t.lse != nullptr, "indexer target tensors missing");
    group = t.heads / t.kv_heads;
    q_stride = t.heads * t.qk_dim;
    kv_stride = t.kv_heads * t.qk_dim;
  }
};

// Per-query results of one work item, summed over its queries in order.
struct LossPartial {
  double kl = 0.0;
  double mass = 0.0;
  double best_mass = 0.0;
};

// For one query row: given I (scores), softmax(I) (soft) and p over `n` keys, adds the KL terms
// to kl and overwrites soft with dI = grad_scale · (softmax(I) − p).
template <class T>
double kl_and_dI(T* soft, const T* scores, const T* p, int64_t n, T lse_index, T grad_scale) {
  double kl = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    if (p[c] > T(0)) kl += static_cast<double>(p[c]) * (std::log(static_cast<double>(p[c])) - (scores[c] - lse_index));
    soft[c] = grad_scale * (soft[c] - p[c]);
  }
  return kl;
}

// For one query row of heads rows head_scores[h, :cols] (ld ld) whose visible columns are [lo, hi):
// dw_row[h] += Σ dI · ReLU(score), then head_scores ← dS = dI · w · scale · 1[score > 0] for c in
// [lo, hi) and 0 for the other columns (dI is indexed by column).
template <class T>
void head_gradients(T* head_scores, int64_t ld, double* dw_row, const T* dI, const T* w_row, int64_t heads,
                    int64_t lo, int64_t hi, int64_t cols, T scale) {
  for (int64_t h = 0; h < heads; ++h) {
    T* hs = head_scores + h * ld;
    T dw_sum = 0;
    const T factor = w_row[h] * scale;
    for (int64_t c = lo; c < hi; ++c) {
      dw_sum += dI[c] * relu(hs[c]);
      hs[c] = hs[c] > T(0) ? dI[c] * factor : T(0);
    }
    std::fill(hs, hs + lo, T(0));
    std::fill(hs + hi, hs + cols, T(0));
    dw_row[h] += dw_sum;
  }
}

// The dk turn that query block qb waits for at key block kb: the number of earlier query blocks of
// its batch entry that add to kb's dk rows (those whose visible keys reach into it), given each
// query block's first key block first_blocks[q_blocks].
int64_t dk_turn_of(const Geometry& geo, const int64_t* first_blocks, int64_t qb, int64_t kb) {
  int64_t turn = 0;
  for (int64_t earlier = 0; earlier < qb; ++earlier) {
    const int64_t t1 = std::min((earlier + 1) * kQueryBlock, geo.s.q_len);
    const int64_t last_block = (geo.visible_end(t1 - 1) - 1) / kKeyBlock;
    turn += first_blocks[earlier] <= kb && kb <= last_block;
  }
  return turn;
}

// Element counts of a loss's Buffers: per thread, its workspace (T), double accumulators and int32
// keys; its work items, each with item_words 8-byte words (the KL and selected-mass partial sums,
// and in dense mode the best mass's partial sum and the item's first key block); and per thread,
// packed candidates (2 T each).
struct LossBuffers {
  int64_t per_thread = 0, doubles_per_thread = 0, ints_per_thread = 0, items = 0, item_words = 2;
  int64_t candidates_per_thread = 0;
};

// Dense mode. Workspace: head_scores [rows_max, kKeyBlock], tile [kQueryBlock, kKeyBlock] (I), probs
// [kQueryBlock, kKeyBlock] (p), main_logits [main_rows, kKeyBlock] (P_h, then softmax(I) and dI in its
// first kQueryBlock rows), main_q_rows [kv_heads, main_rows, qk], dq_acc [rows_max, d], dk_part
// [kKeyBlock, d], lse_index [kQueryBlock] (main_rows = kQueryBlock · group); dw_acc [rows_max]
// (double); the selected keys sorted [kQueryBlock, topk] (int32); one item per query block; the best
// mass's candidate lists, as the top-k's (packed).
LossBuffers dense_buffers(const Geometry& geo, const IndexerTarget& t) {
  const int64_t main_rows = kQueryBlock * (t.heads / t.kv_heads), d = geo.s.head_dim;
  return {geo.rows_max * kKeyBlock + 2 * kQueryBlock * kKeyBlock + main_rows * kKeyBlock +
              t.kv_heads * main_rows * t.qk_dim + geo.rows_max * d + kKeyBlock * d + kQueryBlock,
          geo.rows_max,
          kQueryBlock * geo.s.topk,
          geo.s.batch * geo.q_blocks,
          4,
          topk_candidates_per_thread(geo.s)};
}

// Query blocks per batch entry of the sparse loss (one item each).
int64_t sparse_blocks_per_batch(const Geometry& geo) {
  return (geo.s.q_len + kSparseQueryBlock - 1) / kSparseQueryBlock;
}

// Sparse mode. Workspace: k_selected [topk, d], head_scores [heads, topk], scores, soft, p [topk],
// main_k_selected [topk, qk], main_logits [group, topk], dk_rows [kSparseQueryBlock, topk, d]; dw_row
// [heads] (double); no int32 keys.
LossBuffers sparse_buffers(const Geometry& geo, const IndexerTarget& t) {
  const int64_t topk = geo.s.topk, d = geo.s.head_dim;
  return {topk * d + geo.s.heads * topk + 3 * topk + topk * t.qk_dim + (t.heads / t.kv_heads) * topk +
              kSparseQueryBlock * topk * d,
          geo.s.heads, 0, geo.s.batch * sparse_blocks_per_batch(geo)};
}

template <class T>
LossPartial dense_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                       const TargetGeometry& tg, double coef, const Geometry& geo) {
  const IndexerSizes& s = geo.s;
  const int64_t heads = s.heads, d = s.head_dim, qk = tg.t.qk_dim, group = tg.group;
  const T* main_q = static_cast<const T*>(tg.t.q);
  const T* main_k = static_cast<const T*>(tg.t.k);
  const T* main_lse = static_cast<const T*>(tg.t.lse);
  const T grad_scale = T(coef / double(s.batch * s.q_len)), scale = T(s.scale), main_scale = T(tg.t.scale);
  const T inv_heads = T(1.0 / double(tg.t.heads));
  const int64_t main_rows = kQueryBlock * group;
  const LossBuffers buffers = dense_buffers(geo, tg.t);  // layouts below
  const int64_t per_thread = buffers.per_thread, items = buffers.items;
  Buffer<T> workspace(per_thread * num_threads());
  Buffer<typename PackedRank<T>::Packed> candidates(buffers.candidates_per_thread * num_threads());
  Buffer<double> dw_workspace(buffers.doubles_per_thread * num_threads());
  Buffer<int32_t> selected_workspace(buffers.ints_per_thread * num_threads());
  Buffer<double> kl_partial(items), mass_partial(items), best_partial(items);  // [items]
  // dk turn per (batch, key block): the number of query blocks that have added their part.
  std::unique_ptr<Turn[]> dk_turn(new Turn[s.batch * geo.k_blocks]);
  Buffer<int64_t> first_blocks(items);  // [batch, q_blocks]: each item's first key block
  for (int64_t item = 0; item < items; ++item) {
    const int64_t b = item / geo.q_blocks, t0 = (item % geo.q_blocks) * kQueryBlock;
    first_blocks[item] = geo.first_key_block(b, t0, std::min(t0 + kQueryBlock, s.q_len));
  }
  std::fill(dk, dk + s.batch * s.kv_len * d, T(0));
  std::atomic<int64_t> next_item{0};

  parallel_region([&] {
    const int thread = omp_get_thread_num();
    T* head_scores = workspace.data() + per_thread * thread;  // [rows_max, kKeyBlock]: scores, then dS
    T* tile = head_scores + geo.rows_max * kKeyBlock;         // [kQueryBlock, kKeyBlock]: I
    T* probs = tile + kQueryBlock * kKeyBlock;                // [kQueryBlock, kKeyBlock]: p
    T* main_logits = probs + kQueryBlock * kKeyBlock;         // [main_rows, kKeyBlock]
    T* main_q_rows = main_logits + main_rows * kKeyBlock;     // [kv_heads, main_rows, qk]
    T* dq_acc = main_q_rows + tg.t.kv_heads * main_rows * qk; // [rows_max, d]
    T* dk_part = dq_acc + geo.rows_max * d;                   // [kKeyBlock, d]
    T* lse_index = dk_part + kKeyBlock * d;                   // [kQueryBlock]
    double* dw_acc = dw_workspace.data() + geo.rows_max * thread;                 // [rows_max]
    int32_t* selected = selected_workspace.data() + kQueryBlock * s.topk * thread;  // [kQueryBlock, topk]
    // Items are claimed in increasing order, which the dk turn order relies on.
    for (int64_t item = next_item.fetch_add(1); item < items; item = next_item.fetch_add(1)) {
      const int64_t qb = item % geo.q_blocks, b = item / geo.q_blocks;
      const int64_t t0 = qb * kQueryBlock, t1 = std::min(t0 + kQueryBlock, s.q_len), queries = t1 - t0;
      const int64_t key_begin = first_blocks[item] * kKeyBlock, key_end = geo.visible_end(t1 - 1);
      // Pass 1: lse_index[query] = log Σ_visible exp(I), online over key blocks.
      T* row_max = probs;  // [queries] scratch for this pass
      T* row_sum = probs + kQueryBlock;
      std::fill(row_max, row_max + queries, -std::numeric_limits<T>::infinity());
      std::fill(row_sum, row_sum + queries, T(0));
      for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
        const int64_t cols = std::min(kKeyBlock, key_end - j0);
        score_tile(tile, head_scores, q, k, w, geo, b, t0, t1, j0, cols);
        for (int64_t r = 0; r < queries; ++r) {
          const Geometry::Span span = geo.visible_in_block(b, t0 + r, j0, cols);
          if (span.size() == 0) continue;
          T* row = tile + r * kKeyBlock + span.lo;  // [span]
          const T new_max = std::max(row_max[r], max_value(row, span.size()));
          row_sum[r] = row_sum[r] * std::exp(row_max[r] - new_max) + exp_shifted_sum(row, span.size(), new_max);
          row_max[r] = new_max;
        }
      }
      for (int64_t r = 0; r < queries; ++r) lse_index[r] = row_max[r] + std::log(row_sum[r]);

      // Pass 2 set-up: main query rows per kv head, sorted selections, accumulators.
      for (int64_t kvh = 0; kvh < tg.t.kv_heads; ++kvh)
        for (int64_t t = t0; t < t1; ++t)
          std::memcpy(main_q_rows + (kvh * main_rows + (t - t0) * group) * qk,
                      main_q + (b * s.q_len + t) * tg.q_stride + kvh * group * qk, group * qk * sizeof(T));
      int64_t selected_count[kQueryBlock], cursor[kQueryBlock];
      RunningTopk<T> best[kQueryBlock];  // each query's largest p
      attach_candidate_lists(best, queries, candidates.data(), thread, s.topk);
      for (int64_t r = 0; r < queries; ++r) {
        const int32_t* index_row = geo.index_row(indices, b, t0 + r);
        int32_t* sel = selected + r * s.topk;
        selected_count[r] = 0;
        while (selected_count[r] < s.topk && index_row[selected_count[r]] >= 0) {
          sel[selected_count[r]] = index_row[selected_count[r]];
          ++selected_count[r];
        }
        std::sort(sel, sel + selected_count[r]);
        cursor[r] = 0;
      }
      std::fill(dq_acc, dq_acc + queries * heads * d, T(0));
      std::fill(dw_acc, dw_acc + queries * heads, 0.0);
      double kl = 0.0, mass = 0.0;

      // Pass 2: per key block, I and p again, then KL, selected mass, dI and the gradients.
      for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
        const int64_t kb = j0 / kKeyBlock, cols = std::min(kKeyBlock, key_end - j0);
        score_tile(tile, head_scores, q, k, w, geo, b, t0, t1, j0, cols);
        std::fill(probs, probs + queries * kKeyBlock, T(0));
        for (int64_t kvh = 0; kvh < tg.t.kv_heads; ++kvh) {
          // main_logits[(t − t0)·group + g, c] = main_scale · q_main[t, kvh·group + g] · k_main[j0 + c, kvh]
          gemm<T>(false, true, queries * group, cols, qk, main_scale, main_q_rows + kvh * main_rows * qk, qk,
                  main_k + (b * s.kv_len + j0) * tg.kv_stride + kvh * qk, tg.kv_stride, T(0), main_logits,
                  kKeyBlock);
          for (int64_t r = 0; r < queries; ++r) {
            const Geometry::Span span = geo.visible_in_block(b, t0 + r, j0, cols);
            T* p = probs + r * kKeyBlock;
            for (int64_t g = 0; g < group; ++g) {
              T* logits = main_logits + (r * group + g) * kKeyBlock;
              exp_shifted_sum(logits + span.lo, span.size(),
                              main_lse[(b * tg.t.heads + kvh * group + g) * s.q_len + t0 + r]);
              for (int64_t c = span.lo; c < span.hi; ++c) p[c] += logits[c];
            }
          }
        }
        T* dI = main_logits;  // [kQueryBlock, kKeyBlock] (main_rows ≥ kQueryBlock)
        for (int64_t r = 0; r < queries; ++r) {
          const Geometry::Span span = geo.visible_in_block(b, t0 + r, j0, cols);
          const int64_t lo = span.lo, n = span.size();
          T* p = probs + r * kKeyBlock;
          for (int64_t c = lo; c < span.hi; ++c) p[c] *= inv_heads;
          best[r].offer(p + lo, n, j0 + lo);
          const int32_t* sel = selected + r * s.topk;
          for (; cursor[r] < selected_count[r] && sel[cursor[r]] < j0 + cols; ++cursor[r])
            mass += static_cast<double>(p[sel[cursor[r]] - j0]);
          T* dI_row = dI + r * kKeyBlock;  // [cols]: its span is written
          const T* scores = tile + r * kKeyBlock;
          std::copy(scores + lo, scores + span.hi, dI_row + lo);
          exp_shifted_sum(dI_row + lo, n, lse_index[r]);
          kl += kl_and_dI(dI_row + lo, scores + lo, p + lo, n, lse_index[r], grad_scale);
          head_gradients(head_scores + r * heads * kKeyBlock, kKeyBlock, dw_acc + r * heads, dI_row,
                         w + (b * s.q_len + t0 + r) * heads, heads, lo, span.hi, cols, scale);
        }
        // dq_acc[rows, d] += dS k_block;  dk_part[cols, d] = dSᵀ q_block
        const int64_t rows = queries * heads;
        const T* k_block = k + (b * s.kv_len + j0) * d;
        const T* q_block = q + (b * s.q_len + t0) * heads * d;
        gemm<T>(false, false, rows, d, cols, T(1), head_scores, kKeyBlock, k_block, d, T(1), dq_acc, d);
        gemm<T>(true, false, cols, d, rows, T(1), head_scores, kKeyBlock, q_block, d, T(0), dk_part, d);
        const int64_t my_turn = dk_turn_of(geo, first_blocks.data() + b * geo.q_blocks, qb, kb);
        Turn& turn = dk_turn[b * geo.k_blocks + kb];
        turn.wait_for(my_turn);
        T* dk_rows = dk + (b * s.kv_len + j0) * d;
        for (int64_t i = 0; i < cols * d; ++i) dk_rows[i] += dk_part[i];
        turn.pass_to(my_turn + 1);
      }
      std::copy(dq_acc, dq_acc + queries * heads * d, dq + (b * s.q_len + t0) * heads * d);
      for (int64_t i = 0; i < queries * heads; ++i) dw[(b * s.q_len + t0) * heads + i] = static_cast<T>(dw_acc[i]);
      double best_mass = 0.0;
      for (int64_t r = 0; r < queries; ++r) best_mass += best[r].kept_sum();
      kl_partial[item] = kl;
      mass_partial[item] = mass;
      best_partial[item] = best_mass;
    }
  });
  LossPartial total;
  for (int64_t i = 0; i < items; ++i)
    total.kl += kl_partial[i], total.mass += mass_partial[i], total.best_mass += best_partial[i];
  return total;
}

template <class T>
LossPartial sparse_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                        const TargetGeometry& tg, double coef, const Geometry& geo) {
  const IndexerSizes& s = geo.s;
  const int64_t heads = s.heads, d = s.head_dim, qk = tg.t.qk_dim, group = tg.group, topk = s.topk;
  const T* main_q = static_cast<const T*>(tg.t.q);
  const T* main_k = static_cast<const T*>(tg.t.k);
  const T* main_lse = static_cast<const T*>(tg.t.lse);
  const T grad_scale = T(coef / double(s.batch * s.q_len)), scale = T(s.scale), main_scale = T(tg.t.scale);
  const T inv_heads = T(1.0 / double(tg.t.heads));
  const LossBuffers buffers = sparse_buffers(geo, tg.t);  // layouts below
  const int64_t per_thread = buffers.per_thread, items = buffers.items;
  Buffer<T> workspace(per_thread * num_threads());
  Buffer<double> dw_workspace(buffers.doubles_per_thread * num_threads());  // [threads, heads]
  const int64_t blocks_per_batch = sparse_blocks_per_batch(geo);
  Buffer<double> kl_partial(items), mass_partial(items);  // [items]
  std::atomic<int64_t> next_item{0};
  Turn scatter_turn;
  std::atomic<bool> bad_selection{false};
  std::fill(dk, dk + s.batch * s.kv_len * d, T(0));

  parallel_region([&] {
    const int thread = omp_get_thread_num();
    T* k_selected = workspace.data() + per_thread * thread;  // [topk, d]
    T* head_scores = k_selected + topk * d;                  // [heads, topk]: scores, then dS
    T* scores = head_scores + heads * topk;                  // [topk]: I
    T* soft = scores + topk;                                 // [topk]: softmax(I), then dI
    T* p = soft + topk;                                      // [topk]
    T* main_k_selected = p + topk;                           // [topk, qk]
    T* main_logits = main_k_selected + topk * qk;            // [group, topk]
    T* dk_rows = main_logits + group * topk;                 // [kSparseQueryBlock, topk, d]
    double* dw_row = dw_workspace.data() + heads * thread;   // [heads]
    int64_t counts[kSparseQueryBlock];
    for (int64_t item = next_item.fetch_add(1); item < items; item = next_item.fetch_add(1)) {
      const int64_t b = item / blocks_per_batch;
      const int64_t t0 = (item % blocks_per_batch) * kSparseQueryBlock;
      const int64_t t1 = std::min(t0 + kSparseQueryBlock, s.q_len);
      double kl = 0.0, mass = 0.0;
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t* index_row = geo.index_row(indices, b, t);
        int64_t n = 0;
        while (n < topk && index_row[n] >= geo.visible_begin(b, t) && index_row[n] < geo.visible_end(t)) ++n;
        counts[t - t0] = n;
        if (n == 0 || (n < topk && index_row[n] >= 0)) {
          bad_selection.store(true, std::memory_order_relaxed);
          counts[t - t0] = 0;
          continue;
        }
        for (int64_t c = 0; c < n; ++c) {
          std::memcpy(k_selected + c * d, k + (b * s.kv_len + index_row[c]) * d, d * sizeof(T));
        }
        const T* q_row = q + (b * s.q_len + t) * heads * d;  // [heads, d]
        const T* w_row = w + (b * s.q_len + t) * heads;      // [heads]
        gemm<T>(false, true, heads, n, d, scale, q_row, d, k_selected, d, T(0), head_scores, topk);
        std::fill(scores, scores + n, T(0));
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < n; ++c) scores[c] += w_row[h] * relu(head_scores[h * topk + c]);
        std::copy(scores, scores + n, soft);
        const T top = max_value(scores, n);
        const T lse_index = top + std::log(exp_shifted_sum(soft, n, top));
        std::copy(scores, scores + n, soft);
        exp_shifted_sum(soft, n, lse_index);
        // p over the selection, from the sparse attention's lse (itself over the selection).
        std::fill(p, p + n, T(0));
        for (int64_t kvh = 0; kvh < tg.t.kv_heads; ++kvh) {
          for (int64_t c = 0; c < n; ++c)
            std::memcpy(main_k_selected + c * qk, main_k + (b * s.kv_len + index_row[c]) * tg.kv_stride + kvh * qk,
                        qk * sizeof(T));
          gemm<T>(false, true, group, n, qk, main_scale, main_q + (b * s.q_len + t) * tg.q_stride + kvh * group * qk,
                  qk, main_k_selected, qk, T(0), main_logits, topk);
          for (int64_t g = 0; g < group; ++g) {
            T* logits = main_logits + g * topk;
            exp_shifted_sum(logits, n, main_lse[(b * tg.t.heads + kvh * group + g) * s.q_len + t]);
            for (int64_t c = 0; c < n; ++c) p[c] += logits[c];
          }
        }
        for (int64_t c = 0; c < n; ++c) {
          p[c] *= inv_heads;
          mass += static_cast<double>(p[c]);
        }
        kl += kl_and_dI(soft, scores, p, n, lse_index, grad_scale);
        std::fill(dw_row, dw_row + heads, 0.0);
        head_gradients(head_scores, topk, dw_row, soft, w_row, heads, 0, n, n, scale);
        for (int64_t h = 0; h < heads; ++h) dw[(b * s.q_len + t) * heads + h] = static_cast<T>(dw_row[h]);
        // dq[t][heads, d] = dS k_selected;  dk_rows[t − t0][n, d] = dSᵀ q[t]
        gemm<T>(false, false, heads, d, n, T(1), head_scores, topk, k_selected, d, T(0),
                dq + (b * s.q_len + t) * heads * d, d);
        gemm<T>(true, false, n, d, heads, T(1), head_scores, topk, q_row, d, T(0), dk_rows + (t - t0) * topk * d, d);
      }
      // Scatter the block's dk rows in (query, slot) order, after every earlier item.
      scatter_turn.wait_for(item);
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t* index_row = geo.index_row(indices, b, t);
        for (int64_t c = 0; c < counts[t - t0]; ++c) {
          T* dk_row = dk + (b * s.kv_len + index_row[c]) * d;
          const T* part = dk_rows + ((t - t0) * topk + c) * d;
          for (int64_t i = 0; i < d; ++i) dk_row[i] += part[i];
        }
      }
      scatter_turn.pass_to(item + 1);
      kl_partial[item] = kl;
      mass_partial[item] = mass;
    }
  });
  TRILLION_CHECK(!bad_selection.load(), "indexer_loss (sparse): a selection row is empty, holds an invisible key, "
                 "or is not a prefix of keys padded with -1");
  LossPartial total;
  for (int64_t i = 0; i < items; ++i) total.kl += kl_partial[i], total.mass += mass_partial[i];
  total.best_mass = total.mass;  // p lives on the selection
  return total;
}

}  // namespace

int64_t indexer_loss_workspace_bytes(const IndexerTarget& target, IndexerLossMode mode, const IndexerSizes& sizes,
                                     int threads, int64_t element_bytes) {
  const Geometry geo(sizes);
  const LossBuffers b = mode == IndexerLossMode::kDense ? dense_buffers(geo, target) : sparse_buffers(geo, target);
  const int64_t per_thread = b.per_thread * element_bytes + b.doubles_per_thread * int64_t(sizeof(double)) +
                             b.ints_per_thread * int64_t(sizeof(int32_t)) +
                             b.candidates_per_thread * 2 * element_bytes;  // packed: 2 T
  return per_thread * threads + b.item_words * b.items * 8;
}

template <class T>
IndexerLossResult indexer_loss(T* dq, T* dk, T* dw, const T* q, const T* k, const T* w, const int32_t* indices,
                               const IndexerTarget& target, IndexerLossMode mode, double coef,
                               const IndexerSizes& sizes) {
  const Geometry geo(sizes);
  const TargetGeometry tg(target, sizes);
  const LossPartial total = mode == IndexerLossMode::kDense ? dense_loss(dq, dk, dw, q, k, w, indices, tg, coef, geo)
                                                            : sparse_loss(dq, dk, dw, q, k, w, indices, tg, coef, geo);
  const double queries = double(sizes.batch * sizes.q_len);
  return {total.kl / queries, total.mass / queries, total.best_mass / queries};
}

#define TRILLION_INSTANTIATE_INDEXER(T)                                                                    \
  template void indexer_topk<T>(int32_t*, const T*, const T*, const T*, const IndexerSizes&);             \
  template IndexerLossResult indexer_loss<T>(T*, T*, T*, const T*, const T*, const T*, const int32_t*,     \
                                             const IndexerTarget&, IndexerLossMode, double, const IndexerSizes&);
TRILLION_INSTANTIATE_INDEXER(float)
TRILLION_INSTANTIATE_INDEXER(double)
#undef TRILLION_INSTANTIATE_INDEXER

}  // namespace trillion
