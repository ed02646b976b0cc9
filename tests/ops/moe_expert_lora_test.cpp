// LoRA on the routed experts inside the fused chain (ops/moe_experts.h, ExpertAdapters): the
// adapted chain against the plain chain on merged weights W[e] + scaling · B[e] · A[e] (forward, the
// input and routing-weight gradients, the base weights' gradients, and the pairs' gradients as the
// merged weight's gradient projected through each pair: dB[e] = s · dW[e] · A[e]ᵀ, dA[e] = s ·
// B[e]ᵀ · dW[e]), in double and float; the pairs' gradients against central finite differences in
// double; both layouts (one pair on gate_up's 2I rows, or gate's and up's I rows each), tiles and token
// chunks, capacity drops, and bitwise independence of the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/finite_diff.h"
#include "ops/gemm.h"
#include "ops/moe_experts.h"

namespace trillion {
namespace {

using test::relative_error;

// One pair's shape on a weight of `out` rows: rows row0 .. row0 + rows, rank r.
struct PairShape {
  int64_t row0, rows, rank;
  double scaling;
};

struct Layout {
  std::string name;
  std::vector<PairShape> gate_up, down;  // rows within 2I and H (set per case by make_layout)
};

// The layouts of the chain's adapters for expert width I and hidden size H.
std::vector<Layout> layouts(int64_t I, int64_t H) {
  return {{"fused gate_up and down", {{0, 2 * I, 3, 0.75}}, {{0, H, 2, 1.5}}},
          {"gate and up apart, no down", {{0, I, 2, 2.0}, {I, I, 4, 0.5}}, {}},
          {"down only", {}, {{0, H, 5, 0.4}}}};
}

struct Case {
  int64_t tokens, hidden, inter, experts, top_k, capacity;
  std::string str() const {
    return "N=" + std::to_string(tokens) + " H=" + std::to_string(hidden) + " I=" + std::to_string(inter) +
           " E=" + std::to_string(experts) + " k=" + std::to_string(top_k) + " cap=" + std::to_string(capacity);
  }
};

// Values of one adapted problem in double (cast to T when run).
struct Problem {
  Case c;
  Layout layout;
  std::vector<int32_t> index;                      // [N, k]
  std::vector<double> x, gate_up, down, weight, dy;  // [N, H], [E, 2I, H], [E, H, I], [N, k], [N, H]
  std::vector<std::vector<double>> a, b;           // per pair (gate_up's, then down's): [E, r, in], [E, rows, r]

  Problem(const Case& cs, Layout l, uint64_t seed) : c(cs), layout(std::move(l)) {
    const int64_t N = c.tokens, H = c.hidden, I = c.inter, E = c.experts, k = c.top_k;
    CounterRng rng(seed, "moe_lora_index");
    for (int64_t s = 0; s < N * k; ++s) {
      int32_t e = int32_t(rng.uniform(s) * double(E));
      if (s % k != 0 && e == index.back()) e = (e + 1) % int32_t(E);  // mostly distinct choices; repeats allowed
      index.push_back(e);
    }
    x = test::random_values(N * H, seed + 1);
    gate_up = test::random_values(E * 2 * I * H, seed + 2, 2.0 / std::sqrt(double(H)));
    down = test::random_values(E * H * I, seed + 3, 2.0 / std::sqrt(double(I)));
    weight = test::random_values(N * k, seed + 4);
    dy = test::random_values(N * H, seed + 5);
    uint64_t s = seed + 10;
    for (const PairShape& p : layout.gate_up) {
      a.push_back(test::random_values(E * p.rank * H, s++, 0.5));
      b.push_back(test::random_values(E * p.rows * p.rank, s++, 0.5));
    }
    for (const PairShape& p : layout.down) {
      a.push_back(test::random_values(E * p.rank * I, s++, 0.5));
      b.push_back(test::random_values(E * p.rows * p.rank, s++, 0.5));
    }
  }
  MoeExpertDims dims() const {
    int64_t rank = 0;
    for (const auto* pairs : {&layout.gate_up, &layout.down})
      for (const PairShape& p : *pairs) rank = std::max(rank, p.rank);
    return {c.hidden, c.inter, c.experts, rank};
  }
  // The pairs' shapes in ExpertAdapters order, with the weight's input width.
  std::vector<std::pair<PairShape, int64_t>> pairs() const {
    std::vector<std::pair<PairShape, int64_t>> all;
    for (const PairShape& p : layout.gate_up) all.push_back({p, c.hidden});
    for (const PairShape& p : layout.down) all.push_back({p, c.inter});
    return all;
  }
};

// The outputs of one run: what forward added to y (from 0), dx, dweight, and every weight gradient.
struct Outputs {
  std::vector<double> y, dx, dweight, dgate_up, ddown;
  std::vector<std::vector<double>> da, db;
};

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The adapted chain, forward and backward, in T; `rebuild`: the backward gets no saved gate_up rows
// or act and forms them again, adapters included.
template <class T>
Outputs run_adapted(const Problem& p, bool backward = true, bool rebuild = false) {
  const Case& c = p.c;
  MoePlan plan;
  moe_plan_build(plan, p.index.data(), c.tokens, c.top_k, c.experts, c.capacity);
  std::vector<T> x = cast<T>(p.x), gate_up = cast<T>(p.gate_up), down = cast<T>(p.down), weight = cast<T>(p.weight);
  std::vector<T> dy = cast<T>(p.dy), y(c.tokens * c.hidden, T(0));
  std::vector<T> gate_up_out(plan.rows() * 2 * c.inter), act(plan.rows() * c.inter);
  std::vector<std::vector<T>> a, b, da, db;
  for (size_t i = 0; i < p.a.size(); ++i) {
    a.push_back(cast<T>(p.a[i]));
    b.push_back(cast<T>(p.b[i]));
    da.emplace_back(p.a[i].size(), T(0));
    db.emplace_back(p.b[i].size(), T(0));
  }
  ExpertAdapters<T> adapters, grads;
  size_t i = 0;
  for (const auto& [shape, in] : p.pairs()) {
    const bool on_gate_up = i < p.layout.gate_up.size();
    (on_gate_up ? adapters.gate_up : adapters.down)
        .push_back({a[i].data(), b[i].data(), shape.rank, shape.row0, shape.rows, shape.scaling});
    (on_gate_up ? grads.gate_up : grads.down).push_back({da[i].data(), db[i].data()});
    ++i;
  }
  const MoeExpertDims dims = p.dims();
  moe_experts_forward(y.data(), gate_up_out.data(), act.data(), x.data(), gate_up.data(), down.data(), weight.data(),
                      plan, dims, adapters);
  Outputs o;
  o.y = widen(y);
  if (!backward) return o;
  std::vector<T> dx(x.size(), T(0)), dweight(weight.size()), dgate_up(gate_up.size(), T(0)), ddown(down.size(), T(0));
  moe_experts_backward(dx.data(), dweight.data(), dgate_up.data(), ddown.data(), dy.data(), x.data(),
                       rebuild ? nullptr : gate_up_out.data(), rebuild ? nullptr : act.data(), gate_up.data(),
                       down.data(), weight.data(), plan, dims, adapters, grads);
  o.dx = widen(dx);
  o.dweight = widen(dweight);
  o.dgate_up = widen(dgate_up);
  o.ddown = widen(ddown);
  for (size_t j = 0; j < da.size(); ++j) {
    o.da.push_back(widen(da[j]));
    o.db.push_back(widen(db[j]));
  }
  return o;
}

// The plain chain on merged weights, in double, with the pairs' gradients projected from the merged
// weights' gradients.
Outputs run_merged(const Problem& p) {
  const Case& c = p.c;
  const int64_t H = c.hidden, I = c.inter, E = c.experts;
  std::vector<double> gate_up = p.gate_up, down = p.down;
  size_t i = 0;
  for (const auto& [shape, in] : p.pairs()) {
    const bool on_gate_up = i < p.layout.gate_up.size();
    std::vector<double>& w = on_gate_up ? gate_up : down;
    const int64_t out = on_gate_up ? 2 * I : H;
    for (int64_t e = 0; e < E; ++e)  // W[e][row0:, :] += s · B[e] · A[e]
      gemm<double>(false, false, shape.rows, in, shape.rank, shape.scaling, p.b[i].data() + e * shape.rows * shape.rank,
                   shape.rank, p.a[i].data() + e * shape.rank * in, in, 1.0,
                   w.data() + e * out * in + shape.row0 * in, in);
    ++i;
  }
  MoePlan plan;
  moe_plan_build(plan, p.index.data(), c.tokens, c.top_k, E, c.capacity);
  const MoeExpertDims dims{H, I, E};
  Outputs o;
  o.y.assign(c.tokens * H, 0.0);
  std::vector<double> gate_up_out(plan.rows() * 2 * I), act(plan.rows() * I);
  moe_experts_forward(o.y.data(), gate_up_out.data(), act.data(), p.x.data(), gate_up.data(), down.data(),
                      p.weight.data(), plan, dims);
  o.dx.assign(p.x.size(), 0.0);
  o.dweight.assign(p.weight.size(), 0.0);
  o.dgate_up.assign(gate_up.size(), 0.0);
  o.ddown.assign(down.size(), 0.0);
  moe_experts_backward(o.dx.data(), o.dweight.data(), o.dgate_up.data(), o.ddown.data(), p.dy.data(), p.x.data(),
                       gate_up_out.data(), act.data(), gate_up.data(), down.data(), p.weight.data(), plan, dims);
  i = 0;
  for (const auto& [shape, in] : p.pairs()) {
    const bool on_gate_up = i < p.layout.gate_up.size();
    const std::vector<double>& dw = on_gate_up ? o.dgate_up : o.ddown;
    const int64_t out_rows = on_gate_up ? 2 * I : H, r = shape.rank;
    std::vector<double> da(E * r * in, 0.0), db(E * shape.rows * r, 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const double* dw_slice = dw.data() + e * out_rows * in + shape.row0 * in;  // [rows, in]
      // dA[e][r, in] = s · B[e]ᵀ · dW;  dB[e][rows, r] = s · dW · A[e]ᵀ
      gemm<double>(true, false, r, in, shape.rows, shape.scaling, p.b[i].data() + e * shape.rows * r, r, dw_slice, in,
                   0.0, da.data() + e * r * in, in);
      gemm<double>(false, true, shape.rows, r, in, shape.scaling, dw_slice, in, p.a[i].data() + e * r * in, in, 0.0,
                   db.data() + e * shape.rows * r, r);
    }
    o.da.push_back(std::move(da));
    o.db.push_back(std::move(db));
    ++i;
  }
  return o;
}

void expect_close(const Outputs& got, const Outputs& want, double tol) {
  EXPECT_LE(relative_error(got.y, want.y), tol) << "y";
  EXPECT_LE(relative_error(got.dx, want.dx), tol) << "dx";
  EXPECT_LE(relative_error(got.dweight, want.dweight), tol) << "dweight";
  EXPECT_LE(relative_error(got.dgate_up, want.dgate_up), tol) << "dgate_up";
  EXPECT_LE(relative_error(got.ddown, want.ddown), tol) << "ddown";
  ASSERT_EQ(got.da.size(), want.da.size());
  for (size_t i = 0; i < got.da.size(); ++i) {
    EXPECT_LE(relative_error(got.da[i], want.da[i]), tol) << "dA of pair " << i;
    EXPECT_LE(relative_error(got.db[i], want.db[i]), tol) << "dB of pair " << i;
  }
}

const Case kCases[] = {
    {37, 24, 20, 8, 2, 0},     // odd sizes, dropless
    {1, 16, 8, 4, 1, 0},       // one token
    {600, 24, 16, 3, 2, 0},    // several row tiles per expert and a partial one
    {40, 16, 12, 4, 2, 12},    // capacity drops
    {4500, 8, 6, 5, 2, 0},     // two backward token chunks
};

TEST(MoeExpertLora, DoubleEqualsMergedWeights) {
  for (const Case& c : kCases)
    for (const Layout& layout : layouts(c.inter, c.hidden)) {
      SCOPED_TRACE(c.str() + ", " + layout.name);
      const Problem p(c, layout, 11);
      expect_close(run_adapted<double>(p), run_merged(p), 1e-12);
    }
}

// Float against the double merged reference: a few float epsilons, amplified by the products' depth.
TEST(MoeExpertLora, FloatEqualsDoubleMergedWeights) {
  for (const Case& c : kCases)
    for (const Layout& layout : layouts(c.inter, c.hidden)) {
      SCOPED_TRACE(c.str() + ", " + layout.name);
      const Problem p(c, layout, 12);
      expect_close(run_adapted<float>(p), run_merged(p), 64 * 0x1p-23);
    }
}

// Central differences of L = Σ y ⊙ dy with respect to every element of every pair, in double.
TEST(MoeExpertLora, PairGradientsMatchFiniteDifferences) {
  const Case c{7, 6, 4, 3, 2, 0};
  for (const Layout& layout : layouts(c.inter, c.hidden)) {
    SCOPED_TRACE(layout.name);
    Problem p(c, layout, 13);
    const Outputs analytic = run_adapted<double>(p);
    std::vector<test::GradInput> inputs;
    for (size_t i = 0; i < p.a.size(); ++i) {
      inputs.push_back({"A of pair " + std::to_string(i), &p.a[i], &analytic.da[i]});
      inputs.push_back({"B of pair " + std::to_string(i), &p.b[i], &analytic.db[i]});
    }
    test::expect_gradients_match([&] { return test::weighted_sum(run_adapted<double>(p, false).y, p.dy); }, inputs);
  }
}

// B = 0 (a fresh adapter): the chain gives the plain chain's bits, and the pairs' A gradient is 0.
TEST(MoeExpertLora, ZeroBGivesThePlainChainBitwise) {
  const Case c{37, 24, 20, 8, 2, 0};
  Problem p(c, layouts(c.inter, c.hidden)[0], 14);
  for (std::vector<double>& b : p.b) std::fill(b.begin(), b.end(), 0.0);
  Problem plain = p;
  plain.layout = {"none", {}, {}};
  plain.a.clear();
  plain.b.clear();
  const Outputs adapted = run_adapted<float>(p), base = run_adapted<float>(plain);
  EXPECT_EQ(adapted.y, base.y);
  EXPECT_EQ(adapted.dx, base.dx);
  EXPECT_EQ(adapted.dgate_up, base.dgate_up);
  for (const std::vector<double>& da : adapted.da) EXPECT_EQ(da, std::vector<double>(da.size(), 0.0));
  for (const std::vector<double>& db : adapted.db) EXPECT_NE(db, std::vector<double>(db.size(), 0.0));
}

// Every gradient of two runs, bit for bit (and y, which the backward does not change).
void expect_same_bits(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dweight, b.dweight);
  EXPECT_EQ(a.dgate_up, b.dgate_up);
  EXPECT_EQ(a.ddown, b.ddown);
  EXPECT_EQ(a.da, b.da);
  EXPECT_EQ(a.db, b.db);
}

// The backward rebuilding gate_up rows (through the gate/up pairs) and act gives the saved bits, also
// at real widths with a second token chunk of a few rows.
TEST(MoeExpertLora, RebuiltActivationsGiveTheSavedBits) {
  for (const Case& c : {Case{533, 16, 12, 3, 3, 300}, Case{4100, 128, 96, 4, 2, 0}}) {
    for (const Layout& layout : layouts(c.inter, c.hidden)) {
      SCOPED_TRACE(c.str() + " " + layout.name);
      const Problem p(c, layout, 17);
      expect_same_bits(run_adapted<float>(p), run_adapted<float>(p, true, true));
    }
  }
}

TEST(MoeExpertLora, ResultsDoNotDependOnThreadCount) {
  for (const Case& c : {Case{600, 24, 16, 3, 2, 0}, Case{4500, 8, 6, 5, 2, 0}}) {
    SCOPED_TRACE(c.str());
    const Problem p(c, layouts(c.inter, c.hidden)[0], 15);
    Outputs one, two;
    test::with_threads(1, [&] { one = run_adapted<float>(p); });
    test::with_threads(2, [&] { two = run_adapted<float>(p); });
    expect_same_bits(one, two);
  }
}

TEST(MoeExpertLora, RefusesAPairOutsideItsWeight) {
  const Case c{4, 8, 4, 2, 1, 0};
  Problem p(c, {"up past 2I", {{4, 8, 2, 1.0}}, {}}, 16);
  EXPECT_DEATH(run_adapted<double>(p), "adapter of rank 2 on rows 4..12 of 8");
}

}  // namespace
}  // namespace trillion
