// Tiled causal GQA attention (ops/attention.h) against the plain reference (ops/ref/), central
// finite differences in double, thread-count independence, large logits, and `trillion bench
// attention` at a tiny size.
#include "ops/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/finite_diff.h"
#include "ops/ref/attention_ref.h"
#include "test_support/command.h"

namespace trillion {
namespace {

using test::relative_error;

AttentionSizes make_sizes(int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, int64_t v_dim = 0) {
  return {batch, q_len, kv_len, q_heads, kv_heads, head_dim, 1.0 / std::sqrt(double(head_dim)), v_dim};
}

// Inputs and outputs of one attention call; inputs are normal(0, amplitude²).
template <class T>
struct Problem {
  AttentionSizes s;
  std::vector<T> q, k, v, dout;  // q [b, q_len, q_heads, d], k [b, kv_len, kv_heads, d], v [.., dv], dout [.., dv]
  std::vector<T> out, lse, dq, dk, dv;  // outputs
  Problem(const AttentionSizes& sizes, uint64_t seed, double amplitude = 1.0) : s(sizes) {
    const int64_t nq = s.batch * s.q_len * s.q_heads * s.head_dim;
    const int64_t nkv = s.batch * s.kv_len * s.kv_heads * s.head_dim;
    const int64_t nout = s.batch * s.q_len * s.q_heads * s.value_dim();
    const int64_t nv = s.batch * s.kv_len * s.kv_heads * s.value_dim();
    auto fill = [&](std::vector<T>& x, int64_t n, const char* name) {
      const CounterRng rng(seed, name);
      x.resize(n);
      for (int64_t i = 0; i < n; ++i) x[i] = T(amplitude * rng.normal(i));
    };
    fill(q, nq, "q");
    fill(k, nkv, "k");
    fill(v, nv, "v");
    fill(dout, nout, "dout");
    out.assign(nout, T(0));
    dq.assign(nq, T(0));
    lse.assign(s.batch * s.q_heads * s.q_len, T(0));
    dk.assign(nkv, T(0));
    dv.assign(nv, T(0));
  }
  void run_tiled() {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                       lse.data(), s);
  }
  void run_reference() {
    attention_ref_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    attention_ref_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), s);
  }
};

// A problem of another scalar type with the same inputs.
template <class To, class From>
Problem<To> convert(const Problem<From>& p) {
  Problem<To> c(p.s, 0);
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

// Odd sizes: q_len not a multiple of the tiles, odd head_dim, GQA groups 1, 2, 4, batch 2, decoding.
const AttentionSizes kCases[] = {
    make_sizes(2, 70, 70, 4, 2, 5),     // group 2, odd head_dim
    make_sizes(1, 261, 261, 4, 1, 24),  // group 4, several query and key tiles
    make_sizes(2, 65, 65, 2, 2, 24),    // group 1
    make_sizes(1, 20, 150, 8, 2, 16),   // decoding: q_len < kv_len
    make_sizes(2, 1, 77, 4, 4, 8),      // one new token against a cache
    make_sizes(1, 97, 200, 2, 1, 7),    // long cache, query tiles straddling key tiles
    make_sizes(2, 70, 70, 4, 4, 12, 8),  // MLA-like: query/key head dim 12, value head dim 8
    make_sizes(1, 9, 140, 4, 2, 5, 9),   // value head dim larger, decoding
};

TEST(Attention, DoubleMatchesReference) {
  for (const AttentionSizes& s : kCases) {
    Problem<double> tiled(s, 1), ref(s, 1);
    tiled.run_tiled();
    ref.run_reference();
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " d " << s.head_dim);
    expect_close(tiled, ref, 1e-12);
  }
}

// Document masks: rows of several documents (one of a single token, starts inside and at the edges
// of query and key tiles). The tiled kernel matches the masked reference, and each document's
// slice of the reference equals the reference run on that document alone (packed = separate).
TEST(Attention, DocumentMasksMatchTheReferenceAndSeparateDocuments) {
  const std::vector<std::vector<int32_t>> starts = {{0, 37, 100, 190}, {0, 64, 65, 129, 130}};  // per row
  AttentionSizes s = make_sizes(2, 261, 261, 4, 2, 6);
  std::vector<int32_t> doc_start(2 * 261);  // [batch, q_len]
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 261; ++t) {
      int32_t start = 0;
      for (const int32_t d : starts[b]) start = d <= t ? d : start;
      doc_start[b * 261 + t] = start;
    }
  }
  s.doc_start = doc_start.data();
  Problem<double> tiled(s, 17), reference(s, 17);
  tiled.run_tiled();
  reference.run_reference();
  expect_close(tiled, reference, 1e-12);
  const AttentionSizes& r = reference.s;
  for (int64_t b = 0; b < 2; ++b) {
    for (size_t d = 0; d < starts[b].size(); ++d) {
      const int64_t begin = starts[b][d], end = d + 1 < starts[b].size() ? starts[b][d + 1] : 261, n = end - begin;
      Problem<double> alone(make_sizes(1, n, n, 4, 2, 6), 0);
      const auto slice = [&](const std::vector<double>& x, int64_t width) {
        return std::vector<double>(x.begin() + (b * 261 + begin) * width, x.begin() + (b * 261 + end) * width);
      };
      alone.q = slice(reference.q, r.q_heads * r.head_dim);
      alone.k = slice(reference.k, r.kv_heads * r.head_dim);
      alone.v = slice(reference.v, r.kv_heads * r.head_dim);
      alone.dout = slice(reference.dout, r.q_heads * r.head_dim);
      alone.run_reference();
      // Absolute against the unit scale: a one-token document's dq and dk are zero up to rounding.
      const auto expect_same = [&](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
        EXPECT_LE(worst, 1e-12) << what << ", row " << b << " document " << d;
      };
      expect_same(slice(tiled.out, r.q_heads * r.head_dim), alone.out, "out");
      expect_same(slice(tiled.dq, r.q_heads * r.head_dim), alone.dq, "dq");
      expect_same(slice(tiled.dk, r.kv_heads * r.head_dim), alone.dk, "dk");
      expect_same(slice(tiled.dv, r.kv_heads * r.head_dim), alone.dv, "dv");
    }
  }
}

// Document masks on a chunk of queries against the keys up to its end (q_len < kv_len, as context
// parallelism runs each chunk): starts are key positions, before, at and inside the chunk.
TEST(Attention, DocumentMasksOnAChunkMatchTheReference) {
  AttentionSizes s = make_sizes(2, 75, 203, 4, 2, 6, 5);  // queries at key positions 128 .. 202
  std::vector<int32_t> doc_start(2 * 75);                  // [batch, q_len]
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 75; ++t) {
      const int64_t position = t + 128;
      doc_start[b * 75 + t] = int32_t(b == 0 ? (position < 150 ? 37 : 150) : position - position % 64);
    }
  s.doc_start = doc_start.data();
  Problem<double> tiled(s, 23), reference(s, 23);
  tiled.run_tiled();
  reference.run_reference();
  expect_close(tiled, reference, 1e-12);
}

TEST(Attention, FloatMatchesDoubleReference) {
  for (const AttentionSizes& s : kCases) {
    Problem<float> tiled(s, 2), ref_float(s, 2);
    Problem<double> ref = convert<double>(tiled);
    tiled.run_tiled();
    ref_float.run_reference();
    ref.run_reference();
    SCOPED_TRACE(testing::Message() << "q_len " << s.q_len << " kv_len " << s.kv_len << " d " << s.head_dim);
    expect_close(tiled, ref, 2e-5);
    expect_close(ref_float, ref, 2e-5);
  }
}

// Central differences of L = Σ out ⊙ dout with respect to every element of q, k and v.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const AttentionSizes& s :
       {make_sizes(1, 5, 7, 4, 2, 3), make_sizes(1, 130, 133, 2, 1, 3), make_sizes(1, 6, 6, 2, 2, 4, 3)}) {
    Problem<double> p(s, 3);
    p.run_tiled();
    auto loss = [&]() {
      std::vector<double> out(p.out.size()), lse(p.lse.size());
      attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), s);
      double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += out[i] * p.dout[i];
      return sum;
    };
    const double eps = 1e-5;
    for (auto [x, grad, name] : {std::tuple{&p.q, &p.dq, "dq"}, {&p.k, &p.dk, "dk"}, {&p.v, &p.dv, "dv"}}) {
      std::vector<double> numeric(x->size());
      for (size_t i = 0; i < x->size(); ++i) {
        const double saved = (*x)[i];
        (*x)[i] = saved + eps;
        const double up = loss();
        (*x)[i] = saved - eps;
        const double down = loss();
        (*x)[i] = saved;
        numeric[i] = (up - down) / (2 * eps);
      }
      EXPECT_LE(relative_error(*grad, numeric), 1e-6) << name << " q_len " << s.q_len;
    }
  }
}

// 1, 2 and 3 threads (3 oversubscribes this machine's 2 cores, exercising the dq turn waits).
TEST(Attention, ResultsDoNotDependOnThreadCount) {
  const AttentionSizes s = make_sizes(2, 200, 230, 4, 2, 24, 20);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Problem<float> one(s, 4);
  one.run_tiled();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    Problem<float> many(s, 4);
    many.run_tiled();
    for (auto [a, b] : {std::pair{&one.out, &many.out}, {&one.lse, &many.lse}, {&one.dq, &many.dq},
                        {&one.dk, &many.dk}, {&one.dv, &many.dv}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << threads << " threads";
  }
  omp_set_num_threads(saved_threads);
}

// Scores of magnitude ~50: the online softmax must stay finite and as accurate as the reference.
TEST(Attention, LargeLogitsStayFiniteAndAccurate) {
  const AttentionSizes s = make_sizes(1, 150, 150, 4, 2, 16);
  Problem<float> tiled(s, 5, 3.5);  // |scale · q·k| ≈ 3.5² · √16 = 49 typical
  Problem<double> ref = convert<double>(tiled);
  tiled.run_tiled();
  ref.run_reference();
  double max_logit = 0;
  for (double x : ref.lse) max_logit = std::max(max_logit, std::abs(x));
  EXPECT_GT(max_logit, 30.0);
  for (const std::vector<float>* x : {&tiled.out, &tiled.lse, &tiled.dq, &tiled.dk, &tiled.dv})
    for (float e : *x) ASSERT_TRUE(std::isfinite(e));
  expect_close(tiled, ref, 1e-4);
}

TEST(AttentionBench, TinyRunReportsAccurateJson) {
  const std::string command = std::string(TRILLION_BINARY) +
                              " bench attention --json --seq-len 64 --heads 4 --kv-heads 2 --head-dim 16 "
                              "--runs 2 --baseline-runs 2 --gemm-size 128";
  const auto [status, output] = test::run_shell(command);
  std::string last_line;  // the last line that is a JSON object: the summary
  for (size_t begin = 0; begin < output.size();) {
    size_t end = output.find('\n', begin);
    if (end == std::string::npos) end = output.size();
    if (output[begin] == '{') last_line = output.substr(begin, end - begin);
    begin = end + 1;
  }
  ASSERT_EQ(status, 0) << output;
  const nlohmann::json summary = nlohmann::json::parse(last_line);
  EXPECT_EQ(summary.at("bench"), "attention");
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-4);
  for (const char* field : {"speedup", "ceiling_fraction", "ceiling_gflops", "fused_gflops", "memory_ratio"})
    EXPECT_GT(summary.at(field).get<double>(), 0.0) << field;
  EXPECT_EQ(summary.at("seq_len").get<int64_t>(), 64);
  EXPECT_EQ(summary.at("heads").get<int64_t>(), 4);
  EXPECT_EQ(summary.at("kv_heads").get<int64_t>(), 2);
  EXPECT_EQ(summary.at("head_dim").get<int64_t>(), 16);
}

// TRILLION_ISA picks the vector kernels' instruction set for the whole process, and a bad value is
// refused with the expected ones named.
TEST(AttentionBench, VectorIsaOverride) {
  const auto run = [](const std::string& isa) {
    return test::run_shell("TRILLION_ISA=" + isa + " " + std::string(TRILLION_BINARY) +
                           " bench attention --json --seq-len 32 --heads 2 --kv-heads 1 --head-dim 16 --runs 1 "
                           "--baseline-runs 1 --gemm-size 64 2>&1");
  };
  const auto [status, output] = run("avx2");
  ASSERT_EQ(status, 0) << output;
  const nlohmann::json summary = nlohmann::json::parse(output.substr(output.rfind("\n{") + 1));
  EXPECT_EQ(summary.at("vector_isa"), "avx2");
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-4);
  const auto [bad_status, bad_output] = run("sse2");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad_output.find("TRILLION_ISA=sse2: expected avx2 or avx512"), std::string::npos) << bad_output;
}

TEST(AttentionBench, RejectsHeadsNotDivisibleByKvHeads) {
  const std::string command =
      std::string(TRILLION_BINARY) + " bench attention --seq-len 8 --heads 3 --kv-heads 2 2>&1";
  const auto [status, output] = test::run_shell(command);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("--heads 3 must be a multiple of --kv-heads 2"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
