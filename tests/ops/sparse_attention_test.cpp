// Sparse attention over selected keys (ops/sparse_attention.h): against the tiled dense attention
// (ops/attention.h) with the full causal selection, against the masked dense reference (ops/ref/)
// with random selections, central finite differences in double, thread-count and chunk-size
// independence, the same bits on both instruction sets, and the index checks; under the bf16
// matmul precision, against the references of the rounded and of the exact inputs.
#include "ops/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/finite_diff.h"
#include "ops/ref/sparse_attention_ref.h"

namespace trillion {
namespace {

using test::relative_error;

SparseAttentionSizes make_sizes(int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads, int64_t kv_heads,
                                int64_t qk_dim, int64_t v_dim, int64_t topk) {
  return {batch, q_len, kv_len, q_heads, kv_heads, qk_dim, v_dim, topk, 1.0 / std::sqrt(double(qk_dim))};
}

// indices[batch, q_len, topk]: each row holds distinct visible keys in random order, then −1.
// A row takes min(topk, visible) keys, except every third row, which takes a random count in
// [1, min(topk, visible)] (so rows with fewer keys than topk occur even when many are visible).
std::vector<int32_t> random_indices(const SparseAttentionSizes& s, uint64_t seed) {
  const CounterRng rng(seed, "indices");
  uint64_t counter = 0;
  std::vector<int32_t> indices(s.batch * s.q_len * s.topk, -1);
  std::vector<int32_t> keys;
  for (int64_t row = 0; row < s.batch * s.q_len; ++row) {
    const int64_t visible = row % s.q_len + s.kv_len - s.q_len + 1;
    int64_t count = std::min(s.topk, visible);
    if (row % 3 == 2) count = 1 + int64_t(rng.uniform(counter++) * double(count));
    keys.resize(visible);
    std::iota(keys.begin(), keys.end(), 0);
    for (int64_t c = 0; c < count; ++c) {  // partial Fisher–Yates: keys[0, count) is a random sample in order
      const int64_t pick = c + int64_t(rng.uniform(counter++) * double(visible - c));
      std::swap(keys[c], keys[pick]);
      indices[row * s.topk + c] = keys[c];
    }
  }
  return indices;
}

std::vector<int32_t> full_causal_indices(const SparseAttentionSizes& s) {
  std::vector<int32_t> indices(s.batch * s.q_len * s.topk);
  causal_all_indices(indices.data(), s.batch, s.q_len, s.kv_len, s.topk);
  return indices;
}

// Inputs and outputs of one sparse attention call; inputs are normal(0, 1).
template <class T>
struct Problem {
  SparseAttentionSizes s;
  std::vector<int32_t> indices;          // [batch, q_len, topk]
  std::vector<T> q, k, v, dout;          // [b, q_len, q_heads, qk_dim] / [b, kv_len, kv_heads, qk_dim | v_dim]
  std::vector<T> out, lse, dq, dk, dv;   // outputs, shaped like dout, [b, q_heads, q_len], q, k, v
  Problem(const SparseAttentionSizes& sizes, std::vector<int32_t> selection, uint64_t seed)
      : s(sizes), indices(std::move(selection)) {
    const int64_t nq = s.batch * s.q_len * s.q_heads * s.qk_dim;
    const int64_t nout = s.batch * s.q_len * s.q_heads * s.v_dim;
    const int64_t nk = s.batch * s.kv_len * s.kv_heads * s.qk_dim;
    const int64_t nv = s.batch * s.kv_len * s.kv_heads * s.v_dim;
    auto fill = [&](std::vector<T>& x, int64_t n, const char* name) {
      const CounterRng rng(seed, name);
      x.resize(n);
      for (int64_t i = 0; i < n; ++i) x[i] = T(rng.normal(i));
    };
    fill(q, nq, "q");
    fill(k, nk, "k");
    fill(v, nv, "v");
    fill(dout, nout, "dout");
    out.assign(nout, T(0));
    lse.assign(s.batch * s.q_heads * s.q_len, T(0));
    dq.assign(nq, T(0));
    dk.assign(nk, T(0));
    dv.assign(nv, T(0));
  }
  void run_sparse() {
    sparse_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), indices.data(), s);
    sparse_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              out.data(), lse.data(), indices.data(), s);
  }
  void run_reference() {
    sparse_attention_ref_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), indices.data(), s);
    sparse_attention_ref_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                  indices.data(), s);
  }
  // The engine's tiled dense causal attention (needs qk_dim == v_dim); ignores indices.
  void run_dense() {
    const AttentionSizes dense{s.batch, s.q_len, s.kv_len, s.q_heads, s.kv_heads, s.qk_dim, s.scale};
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), dense);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                       lse.data(), dense);
  }
};

// A problem of another scalar type with the same selection and inputs.
template <class To, class From>
Problem<To> convert(const Problem<From>& p) {
  Problem<To> c(p.s, p.indices, 0);
  c.q.assign(p.q.begin(), p.q.end());
  c.k.assign(p.k.begin(), p.k.end());
  c.v.assign(p.v.begin(), p.v.end());
  c.dout.assign(p.dout.begin(), p.dout.end());
  return c;
}

template <class A, class B>
void expect_close(const Problem<A>& got, const Problem<B>& want, double tol) {
  EXPECT_LE(relative_error(got.out, want.out), tol) << "out";
  EXPECT_LE(relative_error(got.lse, want.lse), tol) << "lse";
  EXPECT_LE(relative_error(got.dq, want.dq), tol) << "dq";
  EXPECT_LE(relative_error(got.dk, want.dk), tol) << "dk";
  EXPECT_LE(relative_error(got.dv, want.dv), tol) << "dv";
}

// Random-selection cases: odd sizes, GQA groups 3 and 6 (6: two blocks of query heads in the
// AVX-512 row kernels, ops/vector_rows.h), qk_dim != v_dim, topk below and above the visible count,
// decoding (q_len < kv_len), batch 2, and selections longer than one key tile.
const SparseAttentionSizes kRandomCases[] = {
    make_sizes(2, 37, 37, 6, 2, 12, 8, 5),
    make_sizes(1, 41, 41, 6, 1, 40, 24, 12),
    make_sizes(1, 37, 37, 6, 2, 12, 8, 40),
    make_sizes(2, 3, 20, 6, 2, 12, 8, 5),
    make_sizes(1, 3, 20, 6, 2, 12, 8, 25),
    make_sizes(1, 300, 310, 4, 2, 72, 36, 290),  // up to 290 keys: three key tiles; wide heads
};

TEST(SparseAttention, FullCausalSelectionMatchesDenseAttention) {
  for (const SparseAttentionSizes& s : {make_sizes(1, 37, 37, 6, 2, 12, 12, 40), make_sizes(2, 3, 20, 6, 2, 12, 12, 23),
                                        make_sizes(1, 200, 200, 4, 1, 16, 16, 200)}) {
    Problem<double> sparse(s, full_causal_indices(s), 1), dense(s, {}, 1);
    sparse.run_sparse();
    dense.run_dense();
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << s.topk);
    expect_close(sparse, dense, 1e-10);
  }
}

TEST(SparseAttention, DoubleMatchesMaskedReference) {
  for (const SparseAttentionSizes& s : kRandomCases) {
    const std::vector<int32_t> indices = random_indices(s, 2);
    Problem<double> sparse(s, indices, 2), ref(s, indices, 2);
    sparse.run_sparse();
    ref.run_reference();
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << s.topk);
    expect_close(sparse, ref, 1e-10);
  }
}

TEST(SparseAttention, FloatMatchesDoubleReference) {
  for (const SparseAttentionSizes& s : kRandomCases) {
    Problem<float> sparse(s, random_indices(s, 3), 3);
    Problem<double> ref = convert<double>(sparse);
    sparse.run_sparse();
    ref.run_reference();
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << s.topk);
    expect_close(sparse, ref, 1e-4);
  }
}

// The problem with its inputs q, k, v and dout rounded to bf16.
template <class T>
Problem<T> rounded_to_bf16(Problem<T> p) {
  for (std::vector<T>* x : {&p.q, &p.k, &p.v, &p.dout})
    for (T& value : *x) value = T(round_to_bf16(float(value)));
  return p;
}

// Under the bf16 matmul precision the float kernels read q, k, v and dout as their bf16 rounding
// and keep everything else in float: they match the double reference of the rounded inputs within
// float's tolerance, as the fp32 kernels match the exact inputs' (the two references differ by
// ~u = 2⁻⁸, bf16's unit roundoff, so this fails unless exactly those four are rounded), and the
// exact inputs' reference within 4u (measured: at most 1.4u here).
TEST(SparseAttention, Bf16RowsMatchTheReferenceOfRoundedInputs) {
  constexpr double kBf16Eps = 0x1.0p-8;
  const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
  std::vector<SparseAttentionSizes> cases(std::begin(kRandomCases), std::end(kRandomCases));
  cases.push_back(make_sizes(1, 40, 45, 2, 2, 192, 128, 30));  // MLA's head dims, compile-time kernels
  cases.push_back(make_sizes(1, 30, 30, 4, 1, 64, 64, 20));    // one kv head: copied to bf16 all the same
  for (const SparseAttentionSizes& s : cases) {
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << s.topk << " qk "
                                    << s.qk_dim);
    Problem<float> sparse(s, random_indices(s, 3), 3);
    Problem<double> exact = convert<double>(sparse), rounded = rounded_to_bf16(convert<double>(sparse));
    sparse.run_sparse();
    exact.run_reference();
    rounded.run_reference();
    expect_close(sparse, rounded, 1e-4);
    expect_close(sparse, exact, 4 * kBf16Eps);
    EXPECT_GT(relative_error(rounded.dk, exact.dk), 1e-3) << "the rounding is visible at this size";
  }
}

// Double is never rounded: the same bits under either precision.
TEST(SparseAttention, DoubleIgnoresTheBf16Precision) {
  const SparseAttentionSizes s = make_sizes(1, 40, 45, 2, 2, 192, 128, 30);
  const std::vector<int32_t> indices = random_indices(s, 7);
  Problem<double> plain(s, indices, 7), under_bf16(s, indices, 7);
  plain.run_sparse();
  {
    const MatmulPrecisionScope bf16_operands(MatmulPrecision::bf16);
    under_bf16.run_sparse();
  }
  for (auto [a, b] : {std::pair{&plain.out, &under_bf16.out}, {&plain.lse, &under_bf16.lse}, {&plain.dq, &under_bf16.dq},
                      {&plain.dk, &under_bf16.dk}, {&plain.dv, &under_bf16.dv}})
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(double)), 0);
}

// The temporaries each kernel holds at its peak are what sparse_attention_*_workspace_bytes say
// (the memory plan's numbers), for float and bf16 rows, one and several kv heads, in float and
// double.
template <class T>
void expect_workspace_as_counted(const SparseAttentionSizes& s, bool bf16_rows) {
  const MatmulPrecisionScope operands(bf16_rows ? MatmulPrecision::bf16 : MatmulPrecision::fp32);
  Problem<T> p = convert<T>(Problem<float>(s, random_indices(s, 11), 11));
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  sparse_attention_forward(p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.indices.data(), s);
  EXPECT_EQ(MemoryStats::peak(Tier::fast) - before,
            sparse_attention_forward_workspace_bytes(s, num_threads(), sizeof(T), bf16_rows));
  MemoryStats::reset_peak(Tier::fast);
  sparse_attention_backward(p.dq.data(), p.dk.data(), p.dv.data(), p.dout.data(), p.q.data(), p.k.data(), p.v.data(),
                            p.out.data(), p.lse.data(), p.indices.data(), s);
  EXPECT_EQ(MemoryStats::peak(Tier::fast) - before,
            sparse_attention_backward_workspace_bytes(s, num_threads(), sizeof(T), bf16_rows));
}

TEST(SparseAttention, WorkspaceIsWhatTheMemoryPlanCounts) {
  for (const SparseAttentionSizes& s : {make_sizes(2, 37, 37, 6, 2, 12, 8, 5), make_sizes(1, 40, 45, 2, 2, 192, 128, 30),
                                        make_sizes(1, 30, 30, 4, 1, 64, 64, 20)}) {
    SCOPED_TRACE(testing::Message() << "kv heads " << s.kv_heads << " qk " << s.qk_dim);
    for (const bool bf16_rows : {false, true}) expect_workspace_as_counted<float>(s, bf16_rows);
    expect_workspace_as_counted<double>(s, false);
  }
}

// Central differences of L = Σ out ⊙ dout with respect to every element of q, k and v, the
// selection held fixed.
TEST(SparseAttention, BackwardMatchesFiniteDifferences) {
  for (const SparseAttentionSizes& s : {make_sizes(1, 7, 9, 4, 2, 5, 3, 4), make_sizes(2, 3, 8, 6, 2, 4, 5, 10)}) {
    Problem<double> p(s, random_indices(s, 4), 4);
    p.run_sparse();
    auto loss = [&]() {
      std::vector<double> out(p.out.size()), lse(p.lse.size());
      sparse_attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), p.indices.data(), s);
      return test::weighted_sum(out, p.dout);
    };
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " topk " << s.topk);
    test::expect_gradients_match(loss, {{"q", &p.q, &p.dq}, {"k", &p.k, &p.dk}, {"v", &p.v, &p.dv}}, 1e-6);
  }
}

// 1, 2 and 3 threads (3 oversubscribes a 2-core machine and splits the items unevenly), float
// rows and bf16 rows.
TEST(SparseAttention, ResultsDoNotDependOnThreadCount) {
  const SparseAttentionSizes s = make_sizes(2, 200, 230, 4, 2, 72, 16, 150);
  const std::vector<int32_t> indices = random_indices(s, 5);
  for (MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
    const MatmulPrecisionScope operands(precision);
    Problem<float> one(s, indices, 5);
    test::with_threads(1, [&] { one.run_sparse(); });
    for (int threads : {2, 3}) {
      Problem<float> many(s, indices, 5);
      test::with_threads(threads, [&] { many.run_sparse(); });
      for (auto [a, b] : {std::pair{&one.out, &many.out}, {&one.lse, &many.lse}, {&one.dq, &many.dq},
                          {&one.dk, &many.dk}, {&one.dv, &many.dv}})
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
            << threads << " threads, " << matmul_precision_name(precision);
    }
  }
}

// The backward in query chunks of a few terms each (SparseAttentionTiling), on 3 threads: the same
// bits as in one chunk on one thread, since each dk and dv row sums its terms in (query, column,
// query head) order either way. Chunks of one query and chunks that do not divide q_len; GQA,
// several kv heads of one query head each (MLA's form: each head's rows copied out and back), one
// kv head (read in place), and a head dim with a compile-time kernel (64 doubles).
TEST(SparseAttention, BackwardChunksGiveTheSameBits) {
  for (const SparseAttentionSizes& s : {make_sizes(2, 37, 37, 6, 2, 12, 8, 5), make_sizes(1, 40, 45, 3, 3, 20, 12, 30),
                                        make_sizes(1, 30, 30, 4, 1, 16, 8, 200), make_sizes(1, 50, 50, 4, 2, 64, 32, 20)}) {
    const std::vector<int32_t> indices = random_indices(s, 10);
    const int64_t query_terms = s.topk * (s.q_heads / s.kv_heads);
    Problem<double> whole(s, indices, 10);
    ASSERT_LE(s.q_len * query_terms, SparseAttentionTiling{}.chunk_terms) << "the default is one chunk here";
    test::with_threads(1, [&] { whole.run_sparse(); });
    for (int64_t chunk_terms : {int64_t(1), 4 * query_terms, 7 * query_terms}) {
      Problem<double> chunked(s, indices, 10);
      test::with_threads(3, [&] {
        sparse_attention_backward(chunked.dq.data(), chunked.dk.data(), chunked.dv.data(), chunked.dout.data(),
                                  chunked.q.data(), chunked.k.data(), chunked.v.data(), whole.out.data(),
                                  whole.lse.data(), indices.data(), s, SparseAttentionTiling{chunk_terms});
      });
      for (auto [a, b] : {std::pair{&whole.dq, &chunked.dq}, {&whole.dk, &chunked.dk}, {&whole.dv, &chunked.dv}})
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(double)), 0)
            << "kv heads " << s.kv_heads << ", chunks of " << chunk_terms << " terms";
    }
  }
}

TEST(SparseAttentionDeathTest, InvalidIndicesFailChecks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const SparseAttentionSizes s = make_sizes(1, 6, 10, 4, 2, 4, 4, 5);  // query t sees keys 0 .. t + 4
  // Every row {0, 1, 2, −1, −1} except row t = 2 (sees keys 0 .. 6): {3, 0, 5, −1, −1}.
  std::vector<int32_t> valid(s.q_len * s.topk, -1);  // [1, 6, 5]
  for (int64_t t = 0; t < s.q_len; ++t)
    for (int32_t c = 0; c < 3; ++c) valid[t * s.topk + c] = c;
  valid[2 * s.topk + 0] = 3, valid[2 * s.topk + 2] = 5;
  Problem<float> p(s, valid, 6);
  auto forward_with = [&](int64_t column, int32_t key) {
    p.indices = valid;
    p.indices[2 * s.topk + column] = key;
    sparse_attention_forward(p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.indices.data(), s);
  };
  forward_with(2, 5);  // the valid selection itself passes
  for (float x : p.lse) EXPECT_TRUE(std::isfinite(x));
  EXPECT_DEATH(forward_with(2, 3), R"(indices\[0, 2, 2\] = 3 repeats a key)");
  EXPECT_DEATH(forward_with(1, 7), R"(indices\[0, 2, 1\] = 7 is not a key visible to query 2)");
  EXPECT_DEATH(forward_with(1, 10), "is not a key visible");
  EXPECT_DEATH(forward_with(0, -2), "is not a key visible");
  EXPECT_DEATH(forward_with(4, 1), R"(indices\[0, 2, 4\] = 1 follows -1 padding)");
  EXPECT_DEATH(
      {
        p.indices = valid;
        std::fill(p.indices.begin() + 4 * s.topk, p.indices.begin() + 5 * s.topk, -1);
        sparse_attention_forward(p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.indices.data(),
                                 s);
      },
      R"(row \(0, 4\) selects no key)");
  EXPECT_DEATH(
      {
        p.indices = valid;
        p.indices[2 * s.topk + 1] = 3;
        sparse_attention_backward(p.dq.data(), p.dk.data(), p.dv.data(), p.dout.data(), p.q.data(), p.k.data(),
                                  p.v.data(), p.out.data(), p.lse.data(), p.indices.data(), s);
      },
      "repeats a key");
}

}  // namespace
}  // namespace trillion

namespace trillion {
namespace {

// The head dims with compile-time dot-product kernels (64, 128, 192 floats; 64 doubles), GQA and
// MLA-like shapes, against the masked reference: float within float tolerance, double tightly.
TEST(SparseAttention, SpecializedHeadDimsMatchReference) {
  for (const SparseAttentionSizes& s : {make_sizes(1, 70, 70, 4, 2, 64, 128, 40),
                                        make_sizes(1, 40, 45, 2, 2, 192, 128, 30)}) {
    SCOPED_TRACE(testing::Message() << "qk " << s.qk_dim << " v " << s.v_dim);
    const std::vector<int32_t> indices = random_indices(s, 6);
    Problem<float> sparse(s, indices, 6);
    Problem<double> ref = convert<double>(sparse), sparse_double = convert<double>(sparse);
    sparse.run_sparse();
    sparse_double.run_sparse();
    ref.run_reference();
    expect_close(sparse, ref, 1e-4);
    expect_close(sparse_double, ref, 1e-10);
  }
}

}  // namespace
}  // namespace trillion

namespace trillion {
namespace {

// Document masks: a selected key before the query's document start is refused, naming the range;
// also in a chunk whose queries see the keys up to its end.
TEST(SparseAttentionDeathTest, KeysOutsideTheQuerysDocumentFailChecks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SparseAttentionSizes s = make_sizes(1, 6, 6, 4, 2, 4, 4, 2);
  const std::vector<int32_t> doc_start = {0, 0, 0, 3, 3, 5};  // [1, 6]: documents [0, 3), [3, 5), [5, 6)
  s.doc_start = doc_start.data();
  std::vector<int32_t> valid(s.q_len * s.topk);  // [1, 6, 2]: the document's first key, then the query's own
  for (int64_t t = 0; t < s.q_len; ++t) {
    valid[t * s.topk] = doc_start[t];
    valid[t * s.topk + 1] = t > doc_start[t] ? int32_t(t) : -1;
  }
  Problem<float> p(s, valid, 9);
  sparse_attention_forward(p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), valid.data(), s);
  for (float x : p.lse) EXPECT_TRUE(std::isfinite(x));
  p.indices = valid;
  p.indices[4 * s.topk] = 2;
  EXPECT_DEATH(
      sparse_attention_forward(p.out.data(), p.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.indices.data(), s),
      R"(indices\[0, 4, 0\] = 2 is not a key visible to query 4 \(3 <= j < 5\))");
  // A context-parallel chunk: the last 3 queries (positions 3 to 5) against all 6 keys, the same documents.
  SparseAttentionSizes chunk = make_sizes(1, 3, 6, 4, 2, 4, 4, 2);
  const std::vector<int32_t> chunk_doc_start = {3, 3, 5};
  chunk.doc_start = chunk_doc_start.data();
  const std::vector<int32_t> chunk_valid = {3, -1, 3, 4, 5, -1};  // [1, 3, 2]
  Problem<float> c(chunk, chunk_valid, 10);
  sparse_attention_forward(c.out.data(), c.lse.data(), c.q.data(), c.k.data(), c.v.data(), chunk_valid.data(), chunk);
  for (float x : c.lse) EXPECT_TRUE(std::isfinite(x));
  c.indices = chunk_valid;
  c.indices[1 * chunk.topk] = 2;
  EXPECT_DEATH(
      sparse_attention_forward(c.out.data(), c.lse.data(), c.q.data(), c.k.data(), c.v.data(), c.indices.data(), chunk),
      R"(indices\[0, 1, 0\] = 2 is not a key visible to query 1 \(3 <= j < 5\))");
}

}  // namespace
}  // namespace trillion

namespace trillion {
namespace {

// The row kernels run on AVX-512 or on AVX2 (ops/vector_rows.h, chosen at start-up): both give the
// same bits, on the specialized head dims and on odd ones with a scalar tail, in float (with float
// and with bf16 rows) and double.
template <class T>
void expect_isas_agree(const SparseAttentionSizes& s, uint64_t seed, MatmulPrecision precision) {
  const MatmulPrecisionScope operands(precision);
  const std::vector<int32_t> indices = random_indices(s, seed);
  const Problem<T> base = convert<T>(Problem<float>(s, indices, seed));
  Problem<T> avx2 = base, avx512 = base;
  test::with_isa(VectorIsa::avx2, [&] { avx2.run_sparse(); });
  test::with_isa(VectorIsa::avx512, [&] { avx512.run_sparse(); });
  for (auto [a, b] : {std::pair{&avx2.out, &avx512.out}, {&avx2.lse, &avx512.lse}, {&avx2.dq, &avx512.dq},
                      {&avx2.dk, &avx512.dk}, {&avx2.dv, &avx512.dv}})
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(T)), 0)
        << "qk " << s.qk_dim << " v " << s.v_dim << " " << matmul_precision_name(precision);
}

TEST(SparseAttention, BothInstructionSetsGiveTheSameBits) {
  if (!cpu_supports(VectorIsa::avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  // Groups of 2, 1, 6 (a block of four query heads and one of two under AVX-512, six single rows
  // under AVX2) and 5, with compile-time and any head dims.
  for (const SparseAttentionSizes& s : {make_sizes(1, 70, 70, 4, 2, 64, 128, 40), make_sizes(1, 40, 45, 2, 2, 192, 128, 30),
                                        make_sizes(2, 50, 60, 4, 2, 72, 21, 33), make_sizes(1, 45, 50, 6, 1, 64, 64, 20),
                                        make_sizes(1, 33, 33, 5, 1, 72, 40, 17)}) {
    expect_isas_agree<float>(s, 8, MatmulPrecision::fp32);
    expect_isas_agree<float>(s, 8, MatmulPrecision::bf16);
    expect_isas_agree<double>(s, 9, MatmulPrecision::bf16);  // double is never rounded
  }
}

}  // namespace
}  // namespace trillion
