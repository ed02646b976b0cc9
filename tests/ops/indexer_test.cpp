// The lightning indexer (ops/indexer.h) against the plain reference (ops/ref/indexer_ref.h): the
// streamed top-k equals a full stable sort exactly where scores are exact (heavy ties from ReLU
// zeros and small integers), ranks random scores as it does up to swaps within rounding, and pads
// short rows with −1; the KL loss in both modes equals the reference
// loss, selected and best masses and gradients, the gradients match central finite differences, results do not
// depend on the thread count, and KL is 0 exactly when the two distributions agree; all of it again
// with document masks, where every query sees only its own document (also a context-parallel chunk's
// last queries of a row against every key before them).
#include "ops/indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "ops/attention.h"
#include "ops/finite_diff.h"
#include "ops/ref/indexer_ref.h"

namespace trillion {
namespace {

using test::relative_error;

IndexerSizes make_sizes(int64_t batch, int64_t q_len, int64_t kv_len, int64_t topk) {
  const int64_t heads = 3, head_dim = 6;
  return {batch, q_len, kv_len, heads, head_dim, topk, 1.0 / std::sqrt(double(head_dim))};
}

// Odd sizes: training (q_len = kv_len), decoding (q_len < kv_len), several query and key blocks.
const IndexerSizes kCases[] = {make_sizes(1, 37, 37, 7), make_sizes(1, 5, 23, 7), make_sizes(2, 150, 300, 40)};

// n values of normal(0, 1) from (seed, name).
template <class T>
std::vector<T> normal_values(int64_t n, uint64_t seed, const char* name) {
  const CounterRng rng(seed, name);
  std::vector<T> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = T(rng.normal(i));
  return x;
}

// Indexer inputs: q [batch, q_len, heads, head_dim], k [batch, kv_len, head_dim], w [batch, q_len, heads].
template <class T>
struct IndexerInputs {
  IndexerSizes s;
  std::vector<T> q, k, w;
  IndexerInputs(const IndexerSizes& sizes, uint64_t seed) : s(sizes) {
    q = normal_values<T>(s.batch * s.q_len * s.heads * s.head_dim, seed, "q");
    k = normal_values<T>(s.batch * s.kv_len * s.head_dim, seed, "k");
    w = normal_values<T>(s.batch * s.q_len * s.heads, seed, "w");
  }
  // Small integers in q, k, w ∈ {0.5, 1} and scale 1/2: every score is exact in any summation
  // order, most are tied, and ReLU makes many exactly 0.
  void make_ties() {
    s.scale = 0.5;
    for (T& x : q) x = std::round(x);
    for (T& x : k) x = std::round(x);
    for (T& x : w) x = x > 0 ? T(1) : T(0.5);
  }
  std::vector<int32_t> topk() const {
    std::vector<int32_t> indices(s.batch * s.q_len * s.topk);
    indexer_topk(indices.data(), q.data(), k.data(), w.data(), s);
    return indices;
  }
  std::vector<int32_t> ref_topk() const {
    std::vector<int32_t> indices(s.batch * s.q_len * s.topk);
    indexer_ref_topk(indices.data(), q.data(), k.data(), w.data(), s);
    return indices;
  }
};

// Random scores: the kernel's come from a GEMM that sums in its library's order (oneDNN's AVX-512
// kernels differ from a plain loop in the last bits), the reference's from plain loops, so two keys
// whose scores agree within that rounding may swap. At every rank the two selections' reference
// scores agree within it, and no key is selected twice.
template <class T>
void expect_same_ranking(const IndexerInputs<T>& in, const std::vector<int32_t>& got,
                         const std::vector<int32_t>& want) {
  const IndexerSizes& s = in.s;
  std::vector<T> scores(s.batch * s.q_len * s.kv_len);  // [batch, q_len, kv_len]
  indexer_ref_scores(scores.data(), in.q.data(), in.k.data(), in.w.data(), s);
  const double rounding = 64.0 * std::numeric_limits<T>::epsilon();  // (heads + head_dim) terms, with slack
  for (int64_t row = 0; row < s.batch * s.q_len; ++row) {
    const T* row_scores = scores.data() + row * s.kv_len;  // [kv_len]
    const int32_t* g = got.data() + row * s.topk;          // [topk]
    const int32_t* w = want.data() + row * s.topk;         // [topk]
    std::vector<bool> selected(s.kv_len, false);
    for (int64_t c = 0; c < s.topk; ++c) {
      ASSERT_EQ(g[c] < 0, w[c] < 0) << "row " << row << " slot " << c;
      if (w[c] < 0) continue;
      ASSERT_LT(g[c], s.kv_len) << "row " << row << " slot " << c;
      ASSERT_FALSE(selected[g[c]]) << "key " << g[c] << " selected twice in row " << row;
      selected[g[c]] = true;
      const double expected = row_scores[w[c]];
      ASSERT_NEAR(double(row_scores[g[c]]), expected, rounding * (1.0 + std::abs(expected)))
          << "row " << row << " slot " << c << ": key " << g[c] << " where the full sort has " << w[c];
    }
  }
}

template <class T>
void expect_topk_matches_full_sort(bool ties) {
  for (IndexerSizes s : kCases) {
    for (int64_t topk : {int64_t(1), int64_t(7), s.kv_len, s.kv_len + 3}) {
      s.topk = topk;
      IndexerInputs<T> in(s, 1);
      if (ties) in.make_ties();
      const std::vector<int32_t> got = in.topk(), want = in.ref_topk();
      if (ties) {
        EXPECT_EQ(got, want) << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << topk;
      } else {
        expect_same_ranking(in, got, want);
      }
      // Rows hold min(topk, visible) keys, then −1.
      for (int64_t t = 0; t < s.q_len; ++t) {
        const int64_t valid = std::min(topk, t + s.kv_len - s.q_len + 1);
        const int32_t* row = got.data() + ((s.batch - 1) * s.q_len + t) * topk;
        for (int64_t c = 0; c < topk; ++c) ASSERT_EQ(row[c] < 0, c >= valid) << "t " << t << " slot " << c;
      }
    }
  }
}

TEST(IndexerTopk, MatchesFullSortOnRandomScores) {
  expect_topk_matches_full_sort<float>(false);
  expect_topk_matches_full_sort<double>(false);
}

TEST(IndexerTopk, MatchesFullSortWithHeavyTies) {
  // The tie inputs really are tie-heavy: most visible scores share their value with another key.
  IndexerInputs<double> in(kCases[2], 1);
  in.make_ties();
  std::vector<double> scores(in.s.batch * in.s.q_len * in.s.kv_len);
  indexer_ref_scores(scores.data(), in.q.data(), in.k.data(), in.w.data(), in.s);
  int64_t zeros = 0, visible = 0;
  for (double x : scores) zeros += x == 0.0, visible += x > -INFINITY;
  EXPECT_GT(zeros, visible / 8);
  expect_topk_matches_full_sort<float>(true);
  expect_topk_matches_full_sort<double>(true);
}

TEST(IndexerTopk, ResultsDoNotDependOnThreadCount) {
  for (bool ties : {false, true}) {
    IndexerInputs<float> in(kCases[2], 2);
    if (ties) in.make_ties();
    std::vector<int32_t> one;
    test::with_threads(1, [&] { one = in.topk(); });
    for (int threads : {2, 3}) {
      std::vector<int32_t> many;
      test::with_threads(threads, [&] { many = in.topk(); });
      EXPECT_EQ(one, many) << threads << " threads, ties " << ties;
    }
  }
}

// A NaN in key 5 makes its score NaN for every query that sees it: it ranks first there (as in
// ops/topk.h), in the streamed kernel as in the full sort, so the NaN flows on to the loss.
TEST(IndexerTopk, NanScoresRankFirst) {
  IndexerInputs<float> in(kCases[2], 3);
  in.k[5 * in.s.head_dim + 2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int32_t> got = in.topk();
  EXPECT_EQ(got, in.ref_topk());
  for (int64_t t = 0; t < in.s.q_len; ++t) ASSERT_EQ(got[t * in.s.topk], 5) << "query " << t;
}

// One indexer loss problem: indexer inputs, a selection by indexer_topk, and the main attention
// target (heads 4, kv_heads 2, qk_dim 5) with the lse of the dense attention (dense mode) or of the
// attention over the selection (sparse mode).
template <class T>
struct LossProblem {
  IndexerInputs<T> in;
  IndexerLossMode mode;
  std::vector<int32_t> indices;              // [batch, q_len, topk]
  std::vector<T> main_q, main_k, main_lse;   // [b, q_len, 4, 5], [b, kv_len, 2, 5], [b, 4, q_len]
  IndexerTarget target;
  std::vector<T> dq, dk, dw;                 // gradients, shaped as q, k, w
  IndexerLossResult result;

  LossProblem(const IndexerSizes& sizes, IndexerLossMode loss_mode, uint64_t seed) : in(sizes, seed), mode(loss_mode) {
    const IndexerSizes& s = in.s;
    indices = in.topk();
    target.heads = 4, target.kv_heads = 2, target.qk_dim = 5, target.scale = 1.0 / std::sqrt(5.0);
    main_q = normal_values<T>(s.batch * s.q_len * target.heads * target.qk_dim, seed, "main_q");
    main_k = normal_values<T>(s.batch * s.kv_len * target.kv_heads * target.qk_dim, seed, "main_k");
    main_lse.assign(s.batch * target.heads * s.q_len, T(0));
    target.q = main_q.data(), target.k = main_k.data(), target.lse = main_lse.data();
    if (mode == IndexerLossMode::kDense) {
      const std::vector<T> main_v = normal_values<T>(main_k.size(), seed, "main_v");
      std::vector<T> out(main_q.size());
      AttentionSizes as{s.batch, s.q_len, s.kv_len, target.heads, target.kv_heads, target.qk_dim, target.scale};
      as.doc_start = s.doc_start;
      attention_forward(out.data(), main_lse.data(), main_q.data(), main_k.data(), main_v.data(), as);
    } else {
      indexer_ref_selected_lse(main_lse.data(), indices.data(), target, s);
    }
    dq.assign(in.q.size(), T(0)), dk.assign(in.k.size(), T(0)), dw.assign(in.w.size(), T(0));
  }
  void run(double coef) {
    result = indexer_loss(dq.data(), dk.data(), dw.data(), in.q.data(), in.k.data(), in.w.data(), indices.data(),
                          target, mode, coef, in.s);
  }
  void run_reference(double coef) {
    result = indexer_ref_loss(dq.data(), dk.data(), dw.data(), in.q.data(), in.k.data(), in.w.data(),
                              indices.data(), target, mode, coef, in.s);
  }
};

const char* mode_name(IndexerLossMode mode) { return mode == IndexerLossMode::kDense ? "dense" : "sparse"; }

TEST(IndexerLoss, MatchesReference) {
  for (IndexerLossMode mode : {IndexerLossMode::kDense, IndexerLossMode::kSparse}) {
    for (const IndexerSizes& s : kCases) {
      SCOPED_TRACE(testing::Message() << mode_name(mode) << " q_len " << s.q_len << " kv_len " << s.kv_len);
      LossProblem<double> got(s, mode, 4), want(s, mode, 4);
      got.run(0.7);
      want.run_reference(0.7);
      EXPECT_GT(got.result.loss, 0.0);
      EXPECT_NEAR(got.result.loss, want.result.loss, 1e-10 * std::max(1.0, want.result.loss));
      EXPECT_NEAR(got.result.selected_mass, want.result.selected_mass, 1e-10);
      EXPECT_NEAR(got.result.best_mass, want.result.best_mass, 1e-10);
      EXPECT_GE(got.result.best_mass, got.result.selected_mass - 1e-12);  // no selection holds more
      if (mode == IndexerLossMode::kSparse) {
        EXPECT_NEAR(got.result.selected_mass, 1.0, 1e-12);
        EXPECT_NEAR(got.result.best_mass, 1.0, 1e-12);
      } else {
        EXPECT_LT(got.result.best_mass, 1.0 - 1e-3);  // in every case top-k leaves keys out
      }
      EXPECT_LE(relative_error(got.dq, want.dq), 1e-10) << "dq";
      EXPECT_LE(relative_error(got.dk, want.dk), 1e-10) << "dk";
      EXPECT_LE(relative_error(got.dw, want.dw), 1e-10) << "dw";

      // Float runs the same algorithm to float accuracy.
      LossProblem<float> single(s, mode, 4);
      single.indices = got.indices;  // same selection even where float scores reorder near-ties
      if (mode == IndexerLossMode::kSparse) single.main_lse.assign(got.main_lse.begin(), got.main_lse.end());
      single.run(0.7);
      EXPECT_NEAR(single.result.loss, want.result.loss, 1e-4 * std::max(1.0, want.result.loss));
      EXPECT_LE(relative_error(single.dq, want.dq), 1e-4) << "float dq";
      EXPECT_LE(relative_error(single.dk, want.dk), 1e-4) << "float dk";
      EXPECT_LE(relative_error(single.dw, want.dw), 1e-4) << "float dw";
    }
  }
}

TEST(IndexerLoss, DenseSelectedMassIsOneWhenEveryKeyIsSelected) {
  IndexerSizes s = kCases[1];
  s.topk = s.kv_len;
  LossProblem<double> p(s, IndexerLossMode::kDense, 5);
  p.run(1.0);
  EXPECT_NEAR(p.result.selected_mass, 1.0, 1e-12);
  EXPECT_NEAR(p.result.best_mass, 1.0, 1e-12);
  LossProblem<double> partial(kCases[1], IndexerLossMode::kDense, 5);  // topk 7 of up to 23 keys
  partial.run(1.0);
  EXPECT_LT(partial.result.selected_mass, 1.0 - 1e-3);
}

// Central differences of coef · L with respect to q, k and w (selection and target held fixed).
TEST(IndexerLoss, GradientsMatchFiniteDifferences) {
  for (IndexerLossMode mode : {IndexerLossMode::kDense, IndexerLossMode::kSparse}) {
    SCOPED_TRACE(mode_name(mode));
    const double coef = 0.7;
    LossProblem<double> p(make_sizes(2, 9, 11, 5), mode, 6);
    // Away from the ReLU kink: no q·k within far more than the step (1e-6) of 0.
    double smallest = INFINITY;
    for (int64_t b = 0; b < p.in.s.batch; ++b)
      for (int64_t th = 0; th < p.in.s.q_len * p.in.s.heads; ++th)
        for (int64_t j = 0; j < p.in.s.kv_len; ++j) {
          double x = 0;
          for (int64_t i = 0; i < p.in.s.head_dim; ++i)
            x += p.in.q[(b * p.in.s.q_len * p.in.s.heads + th) * 6 + i] * p.in.k[(b * p.in.s.kv_len + j) * 6 + i];
          smallest = std::min(smallest, std::abs(x));
        }
    ASSERT_GT(smallest, 1e-3);
    p.run(coef);
    const std::vector<double> dq = p.dq, dk = p.dk, dw = p.dw;
    auto loss = [&] {
      p.run(coef);
      return coef * p.result.loss;
    };
    test::expect_gradients_match(loss, {{"q", &p.in.q, &dq}, {"k", &p.in.k, &dk}, {"w", &p.in.w, &dw}});
  }
}

TEST(IndexerLoss, ResultsDoNotDependOnThreadCount) {
  for (IndexerLossMode mode : {IndexerLossMode::kDense, IndexerLossMode::kSparse}) {
    LossProblem<float> one(kCases[2], mode, 7);
    test::with_threads(1, [&] { one.run(0.5); });
    for (int threads : {2, 3}) {
      LossProblem<float> many(kCases[2], mode, 7);
      test::with_threads(threads, [&] { many.run(0.5); });
      SCOPED_TRACE(testing::Message() << mode_name(mode) << " " << threads << " threads");
      EXPECT_EQ(one.result.loss, many.result.loss);
      EXPECT_EQ(one.result.selected_mass, many.result.selected_mass);
      EXPECT_EQ(one.result.best_mass, many.result.best_mass);
      EXPECT_EQ(one.dq, many.dq);
      EXPECT_EQ(one.dk, many.dk);
      EXPECT_EQ(one.dw, many.dw);
    }
  }
}

// With topk 1 both distributions are the point mass on the one selected key: KL and every
// gradient are exactly 0, while the dense loss of the same problem is positive. The main
// attention's logits are made exact (small integers, scale 1/2) so that the lse computed here
// cancels them exactly and p is exactly 1.
TEST(IndexerLoss, KlIsZeroWhenDistributionsAgree) {
  IndexerSizes s = kCases[0];
  s.topk = 1;
  LossProblem<double> sparse(s, IndexerLossMode::kSparse, 8), dense(s, IndexerLossMode::kDense, 8);
  for (double& x : sparse.main_q) x = std::round(x);
  for (double& x : sparse.main_k) x = std::round(x);
  sparse.target.scale = 0.5;
  indexer_ref_selected_lse(sparse.main_lse.data(), sparse.indices.data(), sparse.target, s);
  sparse.run(1.0);
  dense.run(1.0);
  EXPECT_EQ(sparse.result.loss, 0.0);
  EXPECT_EQ(sparse.result.selected_mass, 1.0);
  for (const std::vector<double>* grad : {&sparse.dq, &sparse.dk, &sparse.dw})
    for (double g : *grad) ASSERT_EQ(g, 0.0);
  EXPECT_GT(dense.result.loss, 1e-3);
}

}  // namespace
}  // namespace trillion

namespace trillion {
namespace {

// Long rows against a mid-sized topk: every row's candidate list is compacted many times (the
// quickselect's partition path, not only its short-range sort), in float (the vectorized
// candidate append) and double.
TEST(IndexerTopk, MatchesFullSortWithManyCompactions) {
  const IndexerSizes s = make_sizes(1, 48, 1500, 100);
  IndexerInputs<float> f(s, 7);
  EXPECT_EQ(f.topk(), f.ref_topk());
  IndexerInputs<double> d(s, 7);
  EXPECT_EQ(d.topk(), d.ref_topk());
}

}  // namespace
}  // namespace trillion

namespace trillion {
namespace {

// Document masks over rows of 330 (query blocks of 64, key blocks of 256 in the kernels): documents
// start at and inside block edges; in row 0 the query block [256, 320) lies wholly in a document
// starting at 256, so it skips key block 0, while in row 1 it does not.
const std::vector<std::vector<int32_t>> kDocumentStarts = {{0, 61, 130, 256, 300}, {0, 5, 200, 260, 329}};

// doc_start [batch, q_len]: each position's document start, from the starts of each row's documents.
std::vector<int32_t> document_starts(const std::vector<std::vector<int32_t>>& starts, int64_t q_len) {
  std::vector<int32_t> doc_start;
  for (const std::vector<int32_t>& row : starts)
    for (int64_t t = 0; t < q_len; ++t)
      doc_start.push_back(*std::prev(std::upper_bound(row.begin(), row.end(), int32_t(t))));
  return doc_start;
}

// The document starts of each row's last q_len queries of kv_len (a context-parallel chunk's, whose
// queries see the keys up to its end, bottom-right): [batch, q_len] key positions.
std::vector<int32_t> last_queries(const std::vector<int32_t>& doc_start, int64_t kv_len, int64_t q_len) {
  std::vector<int32_t> last;
  for (size_t row = 0; row < doc_start.size() / kv_len; ++row)
    last.insert(last.end(), doc_start.begin() + row * kv_len + (kv_len - q_len),
                doc_start.begin() + (row + 1) * kv_len);
  return last;
}

// Whole rows, and their last 187 queries against every key (a chunk's shape under context parallelism).
TEST(IndexerDocumentMask, TopkStaysInTheDocumentAndMatchesFullSort) {
  for (const int64_t q_len : {330, 187}) {
    SCOPED_TRACE(testing::Message() << "q_len " << q_len);
    const std::vector<int32_t> doc_start = last_queries(document_starts(kDocumentStarts, 330), 330, q_len);
    IndexerSizes s = make_sizes(2, q_len, 330, 40);
    s.doc_start = doc_start.data();
    const int64_t offset = s.kv_len - s.q_len;
    for (bool ties : {false, true}) {
      IndexerInputs<float> f(s, 11);
      IndexerInputs<double> d(s, 11);
      if (ties) f.make_ties(), d.make_ties();
      const std::vector<int32_t> got = f.topk();
      EXPECT_EQ(got, f.ref_topk()) << "float, ties " << ties;
      EXPECT_EQ(d.topk(), d.ref_topk()) << "double, ties " << ties;
      for (int64_t bt = 0; bt < s.batch * s.q_len; ++bt) {  // min(topk, document keys so far), then −1
        const int64_t t = bt % s.q_len + offset, valid = std::min<int64_t>(s.topk, t - doc_start[bt] + 1);
        for (int64_t c = 0; c < s.topk; ++c) {
          const int32_t j = got[bt * s.topk + c];
          if (c < valid)
            ASSERT_TRUE(j >= doc_start[bt] && j <= t) << "query " << bt << " slot " << c << " key " << j;
          else
            ASSERT_EQ(j, -1) << "query " << bt << " slot " << c;
        }
      }
    }
  }
}

TEST(IndexerDocumentMask, LossMatchesReferenceAndDoesNotDependOnThreadCount) {
  for (const int64_t q_len : {330, 187}) {
    const std::vector<int32_t> doc_start = last_queries(document_starts(kDocumentStarts, 330), 330, q_len);
    IndexerSizes s = make_sizes(2, q_len, 330, 40);
    s.doc_start = doc_start.data();
    for (IndexerLossMode mode : {IndexerLossMode::kDense, IndexerLossMode::kSparse}) {
      SCOPED_TRACE(testing::Message() << mode_name(mode) << ", q_len " << q_len);
      LossProblem<double> got(s, mode, 12), want(s, mode, 12);
      got.run(0.7);
      want.run_reference(0.7);
      EXPECT_GT(got.result.loss, 0.0);
      EXPECT_NEAR(got.result.loss, want.result.loss, 1e-10 * want.result.loss);
      EXPECT_NEAR(got.result.selected_mass, want.result.selected_mass, 1e-10);
      EXPECT_NEAR(got.result.best_mass, want.result.best_mass, 1e-10);
      EXPECT_LE(relative_error(got.dq, want.dq), 1e-10) << "dq";
      EXPECT_LE(relative_error(got.dk, want.dk), 1e-10) << "dk";
      EXPECT_LE(relative_error(got.dw, want.dw), 1e-10) << "dw";
      LossProblem<float> one(s, mode, 12);
      test::with_threads(1, [&] { one.run(0.5); });
      for (int threads : {2, 3}) {
        LossProblem<float> many(s, mode, 12);
        test::with_threads(threads, [&] { many.run(0.5); });
        EXPECT_EQ(one.result.loss, many.result.loss) << threads << " threads";
        EXPECT_EQ(one.dq, many.dq) << threads << " threads";
        EXPECT_EQ(one.dk, many.dk) << threads << " threads";
        EXPECT_EQ(one.dw, many.dw) << threads << " threads";
      }
    }
  }
}

// Central differences with documents of 4, 7 and 1, 6, 4 keys (the selection and target held fixed).
TEST(IndexerDocumentMask, GradientsMatchFiniteDifferences) {
  const std::vector<int32_t> doc_start = document_starts({{0, 4}, {0, 1, 7}}, 11);
  IndexerSizes s = make_sizes(2, 11, 11, 3);
  s.doc_start = doc_start.data();
  for (IndexerLossMode mode : {IndexerLossMode::kDense, IndexerLossMode::kSparse}) {
    SCOPED_TRACE(mode_name(mode));
    LossProblem<double> p(s, mode, 13);
    p.run(0.7);
    const std::vector<double> dq = p.dq, dk = p.dk, dw = p.dw;
    auto loss = [&] {
      p.run(0.7);
      return 0.7 * p.result.loss;
    };
    test::expect_gradients_match(loss, {{"q", &p.in.q, &dq}, {"k", &p.in.k, &dk}, {"w", &p.in.w, &dw}});
  }
}

TEST(IndexerDocumentMaskDeathTest, DocumentStartAfterTheQueryFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int32_t> doc_start = document_starts({{0, 4}}, 6);
  doc_start[2] = 3;
  IndexerSizes s = make_sizes(1, 6, 6, 3);
  s.doc_start = doc_start.data();
  const IndexerInputs<float> in(s, 14);
  EXPECT_DEATH(in.topk(), R"(indexer doc_start\[0, 2\] = 3 is not a key position in \[0, 2\])");
}

}  // namespace
}  // namespace trillion
