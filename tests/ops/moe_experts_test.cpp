// The fused routed experts (ops/moe_experts.h) against the per-token oracle and the fragmented
// baseline (ops/ref/moe_ref.h): forward and every gradient in double and float, the oracle against
// central finite differences, edge cases (empty experts, all tokens to one expert, k = 1, k = E,
// token counts that are not multiples of a tile, capacity drops, frozen experts), bitwise
// independence of the thread count; the plan (moe_plan_build): expert-major, token-ascending
// permutation of the slots t·k + j, capacity drops of later positions first; and `trillion bench moe`
// at a tiny size (its accuracy and counts, not its times).
#include "ops/moe_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "ops/finite_diff.h"
#include "ops/gemm.h"
#include "ops/ref/moe_ref.h"
#include "test_support/command.h"

namespace trillion {
namespace {

using test::relative_error;

struct Case {
  int64_t tokens, hidden, inter, experts, top_k, capacity;
  int64_t active = 0;   // > 0: tokens choose among experts [0, active) only (the rest get none)
  int32_t all_to = -1;  // ≥ 0: every choice of every token goes to this expert
  std::string str() const {
    return "N=" + std::to_string(tokens) + " H=" + std::to_string(hidden) + " I=" + std::to_string(inter) +
           " E=" + std::to_string(experts) + " k=" + std::to_string(top_k) + " cap=" + std::to_string(capacity);
  }
};

// index[N, k]: distinct experts per token (a partial Fisher–Yates shuffle driven by CounterRng), or
// all to one expert.
std::vector<int32_t> make_index(const Case& c, uint64_t seed) {
  const CounterRng rng(seed, "moe_index");
  const int64_t pool = c.active > 0 ? c.active : c.experts;
  std::vector<int32_t> index(c.tokens * c.top_k);
  std::vector<int32_t> perm(pool);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t e = 0; e < pool; ++e) perm[e] = int32_t(e);
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t pick = j + int64_t(rng.uniform(t * c.top_k + j) * double(pool - j));
      std::swap(perm[j], perm[pick]);
      index[t * c.top_k + j] = c.all_to >= 0 ? c.all_to : perm[j];
    }
  }
  return index;
}

// Inputs and outputs of one forward + backward. Accumulated outputs start from random values so the
// += rules are checked; dweight starts from garbage so the = rule (and 0 for dropped slots) is.
template <class T>
struct Problem {
  Case c;
  uint64_t seed;
  MoeExpertDims dims;
  std::vector<int32_t> index;
  std::vector<T> x, gate_up, down, weight, dy;     // [N, H], [E, 2I, H], [E, H, I], [N, k], [N, H]
  std::vector<T> y, dx, dweight, dgate_up, ddown;  // shapes of y, x, weight, gate_up, down
  Problem(const Case& cs, uint64_t sd)
      : c(cs), seed(sd), dims{cs.hidden, cs.inter, cs.experts}, index(make_index(cs, seed)) {
    const int64_t N = c.tokens, H = c.hidden, I = c.inter, E = c.experts, k = c.top_k;
    auto fill = [&](std::vector<T>& v, int64_t n, uint64_t s, double scale) {
      const std::vector<double> r = test::random_values(n, seed * 100 + s, scale);
      v.assign(r.begin(), r.end());
    };
    fill(x, N * H, 1, 1.0);
    fill(gate_up, E * 2 * I * H, 2, 2.0 / std::sqrt(double(H)));
    fill(down, E * H * I, 3, 2.0 / std::sqrt(double(I)));
    fill(weight, N * k, 4, 1.0);
    fill(dy, N * H, 5, 1.0);
    fill(y, N * H, 6, 0.5);
    fill(dx, N * H, 7, 0.5);
    fill(dgate_up, E * 2 * I * H, 8, 0.5);
    fill(ddown, E * H * I, 9, 0.5);
    dweight.assign(N * k, T(7));
  }
  // rebuild_gate_up / rebuild_act: the backward gets no saved gate_up_out / act and forms them again.
  void run_fused(bool weight_grads = true, bool rebuild_gate_up = false, bool rebuild_act = false) {
    MoePlan plan;
    moe_plan_build(plan, index.data(), c.tokens, c.top_k, c.experts, c.capacity);
    gate_up_out.assign(plan.rows() * 2 * c.inter, T(0));
    act.assign(plan.rows() * c.inter, T(0));
    moe_experts_forward(y.data(), gate_up_out.data(), act.data(), x.data(), gate_up.data(), down.data(),
                        weight.data(), plan, dims);
    moe_experts_backward(dx.data(), dweight.data(), weight_grads ? dgate_up.data() : nullptr,
                         weight_grads ? ddown.data() : nullptr, dy.data(), x.data(),
                         rebuild_gate_up ? nullptr : gate_up_out.data(), rebuild_act ? nullptr : act.data(),
                         gate_up.data(), down.data(), weight.data(), plan, dims);
  }
  void run_oracle() {
    moe_oracle_forward(y.data(), x.data(), gate_up.data(), down.data(), weight.data(), index.data(), c.tokens, c.top_k,
                       c.capacity, dims);
    moe_oracle_backward(dx.data(), dweight.data(), dgate_up.data(), ddown.data(), dy.data(), x.data(), gate_up.data(),
                        down.data(), weight.data(), index.data(), c.tokens, c.top_k, c.capacity, dims);
  }
  void run_fragmented() {
    MoePlan plan;
    moe_plan_build(plan, index.data(), c.tokens, c.top_k, c.experts, c.capacity);
    MoeFragmentedSaved<T> saved;
    moe_fragmented_forward(y.data(), saved, x.data(), gate_up.data(), down.data(), weight.data(), plan, dims);
    moe_fragmented_backward(dx.data(), dweight.data(), dgate_up.data(), ddown.data(), dy.data(), saved, gate_up.data(),
                            down.data(), plan, dims);
  }
  std::vector<T> gate_up_out, act;  // fused forward's saved tensors
};

// What an op added to an accumulated output: after − before, in double.
template <class T>
std::vector<double> added(const std::vector<T>& after, const std::vector<T>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < after.size(); ++i) d[i] = double(after[i]) - double(before[i]);
  return d;
}

// Compares what each run added to y, dx, dgate_up, ddown (so the random starting values cannot hide
// an error in a small gradient) and the dweight it wrote.
template <class A, class B>
void expect_close(const Problem<A>& got, const Problem<B>& want, double tol) {
  const Problem<A> start_a(got.c, got.seed);
  const Problem<B> start_b(want.c, want.seed);
  EXPECT_LE(relative_error(added(got.y, start_a.y), added(want.y, start_b.y)), tol) << "y";
  EXPECT_LE(relative_error(added(got.dx, start_a.dx), added(want.dx, start_b.dx)), tol) << "dx";
  EXPECT_LE(relative_error(got.dweight, want.dweight), tol) << "dweight";
  EXPECT_LE(relative_error(added(got.dgate_up, start_a.dgate_up), added(want.dgate_up, start_b.dgate_up)), tol)
      << "dgate_up";
  EXPECT_LE(relative_error(added(got.ddown, start_a.ddown), added(want.ddown, start_b.ddown)), tol) << "ddown";
}

const Case kCases[] = {
    {37, 24, 20, 8, 2, 0},         // odd token count, dropless
    {1, 16, 8, 4, 1, 0},           // one token, k = 1
    {37, 12, 10, 6, 6, 0},         // k = E: every expert gets every token
    {300, 16, 12, 4, 1, 0, 0, 2},  // all tokens to expert 2 (several row tiles), k = 1
    {50, 20, 16, 16, 2, 0, 5},     // experts 5..15 get no tokens
    {40, 16, 12, 4, 2, 12},        // capacity 12 of ~20 slots per expert: drops
    {600, 24, 16, 3, 2, 0},        // ~400 rows per expert: tiles and a partial tile
    {37, 16, 12, 4, 3, 20, 0, 1},  // every choice names expert 1 (repeated expert), capacity 20
    {533, 16, 12, 3, 3, 300},      // k = E with capacity: drops past a tile boundary
    {4500, 8, 6, 5, 2, 0},         // 9000 slots: two backward token chunks
    {3000, 8, 6, 4, 3, 1500},      // two token chunks (k = 3), drops in both
};

TEST(MoeExperts, DoubleMatchesOracle) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    Problem<double> fused(c, 1), oracle(c, 1);
    fused.run_fused();
    oracle.run_oracle();
    expect_close(fused, oracle, 1e-10);
  }
}

TEST(MoeExperts, FloatMatchesDoubleOracle) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    Problem<float> fused(c, 2);
    Problem<double> oracle(c, 2);
    fused.run_fused();
    oracle.run_oracle();
    expect_close(fused, oracle, 1e-5);
  }
}

TEST(MoeExperts, FragmentedMatchesOracle) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    Problem<double> fragmented(c, 3), oracle(c, 3);
    fragmented.run_fragmented();
    oracle.run_oracle();
    expect_close(fragmented, oracle, 1e-10);
    Problem<float> fragmented_float(c, 3);
    fragmented_float.run_fragmented();
    expect_close(fragmented_float, oracle, 1e-5);
  }
}

// Central differences of L = Σ y ⊙ dy with respect to x, gate_up, down and weight; one case dropless,
// one with capacity drops (a dropped slot's weight has gradient 0 both ways).
TEST(MoeExperts, OracleBackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{5, 6, 4, 3, 2, 0}, Case{7, 5, 3, 4, 3, 3}}) {
    SCOPED_TRACE(c.str());
    Problem<double> p(c, 4);
    const std::vector<double> dy = p.dy;
    std::fill(p.dx.begin(), p.dx.end(), 0.0);
    std::fill(p.dgate_up.begin(), p.dgate_up.end(), 0.0);
    std::fill(p.ddown.begin(), p.ddown.end(), 0.0);
    moe_oracle_backward(p.dx.data(), p.dweight.data(), p.dgate_up.data(), p.ddown.data(), dy.data(), p.x.data(),
                        p.gate_up.data(), p.down.data(), p.weight.data(), p.index.data(), c.tokens, c.top_k, c.capacity,
                        p.dims);
    auto loss = [&] {
      std::vector<double> y(c.tokens * c.hidden, 0.0);
      moe_oracle_forward(y.data(), p.x.data(), p.gate_up.data(), p.down.data(), p.weight.data(), p.index.data(),
                         c.tokens, c.top_k, c.capacity, p.dims);
      return test::weighted_sum(y, dy);
    };
    test::expect_gradients_match(loss, {{"x", &p.x, &p.dx},
                                        {"gate_up", &p.gate_up, &p.dgate_up},
                                        {"down", &p.down, &p.ddown},
                                        {"weight", &p.weight, &p.dweight}});
  }
}

// Dropped slots: weight gradient exactly 0; tokens whose slots are all dropped keep y and dx as they were.
TEST(MoeExperts, DroppedSlotsContributeNothing) {
  const Case c{40, 16, 12, 2, 2, 9};  // k = E = 2: every token in both experts, only 9 kept per expert
  Problem<float> p(c, 5);
  const std::vector<float> y0 = p.y, dx0 = p.dx;
  p.run_fused();
  for (int64_t t = 9; t < c.tokens; ++t) {
    for (int64_t j = 0; j < c.top_k; ++j) EXPECT_EQ(p.dweight[t * c.top_k + j], 0.0f) << "token " << t;
    for (int64_t h = 0; h < c.hidden; ++h) {
      ASSERT_EQ(p.y[t * c.hidden + h], y0[t * c.hidden + h]) << "token " << t;
      ASSERT_EQ(p.dx[t * c.hidden + h], dx0[t * c.hidden + h]) << "token " << t;
    }
  }
  for (int64_t t = 0; t < 9; ++t) EXPECT_NE(p.dweight[t * c.top_k], 0.0f) << "token " << t;
}

// Frozen experts (null weight gradients): the input gradients are unchanged.
TEST(MoeExperts, NullWeightGradientsSkipOnlyThem) {
  const Case c{37, 24, 20, 8, 2, 0};
  Problem<double> with(c, 6), without(c, 6);
  with.run_fused();
  without.run_fused(false);
  EXPECT_EQ(with.y, without.y);
  EXPECT_EQ(with.dx, without.dx);
  EXPECT_EQ(with.dweight, without.dweight);
  const Problem<double> fresh(c, 6);
  EXPECT_EQ(without.dgate_up, fresh.dgate_up);
  EXPECT_EQ(without.ddown, fresh.ddown);
}

// No tokens: a valid plan with no rows; forward and backward do nothing.
TEST(MoeExperts, EmptyBatchIsANoOp) {
  MoePlan plan;
  moe_plan_build(plan, nullptr, 0, 2, 4, 0);
  const MoeExpertDims dims{8, 4, 4};
  std::vector<float> gate_up(4 * 8 * 8, 1.0f), down(4 * 8 * 4, 1.0f), dgate_up(gate_up.size()), ddown(down.size());
  moe_experts_forward<float>(nullptr, nullptr, nullptr, nullptr, gate_up.data(), down.data(), nullptr, plan, dims);
  moe_experts_backward<float>(nullptr, nullptr, dgate_up.data(), ddown.data(), nullptr, nullptr, nullptr, nullptr,
                              gate_up.data(), down.data(), nullptr, plan, dims);
  EXPECT_EQ(dgate_up, std::vector<float>(gate_up.size(), 0.0f));
  EXPECT_EQ(ddown, std::vector<float>(down.size(), 0.0f));
}

TEST(MoeExperts, ResultsDoNotDependOnThreadCount) {
  for (const Case& c : {Case{200, 40, 24, 8, 2, 0}, Case{600, 24, 16, 3, 2, 0}, Case{533, 16, 12, 3, 3, 300},
                        Case{3000, 8, 6, 4, 3, 1500}}) {
    SCOPED_TRACE(c.str());
    Problem<float> one(c, 7), two(c, 7);
    test::with_threads(1, [&] { one.run_fused(); });
    test::with_threads(2, [&] { two.run_fused(); });
    for (auto [a, b, name] : {std::tuple{&one.y, &two.y, "y"},
                              {&one.gate_up_out, &two.gate_up_out, "gate_up_out"},
                              {&one.act, &two.act, "act"},
                              {&one.dx, &two.dx, "dx"},
                              {&one.dweight, &two.dweight, "dweight"},
                              {&one.dgate_up, &two.dgate_up, "dgate_up"},
                              {&one.ddown, &two.ddown, "ddown"}}) {
      ASSERT_EQ(a->size(), b->size()) << name;
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << name;
    }
  }
}

// The backward given no saved gate_up rows or act forms them again in its tiles as the forward did:
// the same bits as with them saved, in double, in float and under the bf16 matmul precision, with
// capacity drops and tiles cut at other rows than the forward's (token chunks of 8192 / k slots:
// N = 4100, k = 2 leaves a second chunk of 4 tokens, so tiles of one or two rows, at real widths).
TEST(MoeExperts, RebuiltActivationsGiveTheSavedBits) {
  for (const MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16}) {
    const MatmulPrecisionScope scope(precision);
    for (const Case& c : {Case{37, 24, 20, 8, 2, 0}, Case{533, 16, 12, 3, 3, 300}, Case{3000, 8, 6, 4, 3, 1500},
                          Case{4100, 256, 128, 4, 2, 0}}) {
      SCOPED_TRACE(c.str() + " " + matmul_precision_name(precision));
      Problem<float> saved(c, 9);
      saved.run_fused();
      for (const auto& [gate_up, act] : {std::pair{true, true}, {true, false}, {false, true}}) {
        Problem<float> rebuilt(c, 9);
        rebuilt.run_fused(true, gate_up, act);
        for (auto [a, b, name] : {std::tuple{&saved.dx, &rebuilt.dx, "dx"},
                                  {&saved.dweight, &rebuilt.dweight, "dweight"},
                                  {&saved.dgate_up, &rebuilt.dgate_up, "dgate_up"},
                                  {&saved.ddown, &rebuilt.ddown, "ddown"}})
          EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
              << name << " rebuilding gate_up " << gate_up << " act " << act;
      }
    }
  }
  Problem<double> saved(kCases[0], 3), rebuilt(kCases[0], 3);
  saved.run_fused();
  rebuilt.run_fused(true, true, true);
  EXPECT_EQ(saved.dx, rebuilt.dx);
  EXPECT_EQ(saved.dweight, rebuilt.dweight);
  EXPECT_EQ(saved.dgate_up, rebuilt.dgate_up);
  EXPECT_EQ(saved.ddown, rebuilt.ddown);
}

// index[5, 2] over 3 experts; slots s = t·2 + j.
const std::vector<int32_t> kIndex = {0, 1,   // s0, s1
                                     1, 0,   // s2, s3
                                     0, 2,   // s4, s5
                                     0, 1,   // s6, s7
                                     2, 0};  // s8, s9

TEST(MoePlan, DroplessIsExpertMajorAndTokenAscending) {
  MoePlan plan;
  moe_plan_build(plan, kIndex.data(), 5, 2, 3, 0);
  EXPECT_EQ(plan.tokens, 5);
  EXPECT_EQ(plan.top_k, 2);
  EXPECT_EQ(plan.experts, 3);
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 5, 8, 10}));
  // expert 0: s0 s3 s4 s6 s9; expert 1: s1 s2 s7; expert 2: s5 s8
  EXPECT_EQ(plan.row_slot, (std::vector<int32_t>{0, 3, 4, 6, 9, 1, 2, 7, 5, 8}));
  EXPECT_EQ(plan.slot_row, (std::vector<int32_t>{0, 5, 6, 1, 2, 8, 3, 7, 9, 4}));
  EXPECT_EQ(plan.dropped, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(plan.total_dropped(), 0);
  EXPECT_EQ(plan.rows(), 10);
}

TEST(MoePlan, CapacityDropsLaterPositionsFirst) {
  MoePlan plan;
  moe_plan_build(plan, kIndex.data(), 5, 2, 3, 2);
  // expert 0 keeps s0 s3 (tokens 0, 1) and drops s4 s6 s9; expert 1 keeps s1 s2, drops s7; expert 2 keeps both.
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(plan.row_slot, (std::vector<int32_t>{0, 3, 1, 2, 5, 8}));
  EXPECT_EQ(plan.slot_row, (std::vector<int32_t>{0, 2, 3, 1, -1, 4, -1, -1, 5, -1}));
  EXPECT_EQ(plan.dropped, (std::vector<int64_t>{3, 1, 0}));
  EXPECT_EQ(plan.total_dropped(), 4);
}

TEST(MoePlan, EmptyExpertsAndCapacityAboveLoad) {
  const std::vector<int32_t> index = {3, 3, 3};  // [3, 1]: everything to expert 3 of 5
  MoePlan plan;
  moe_plan_build(plan, index.data(), 3, 1, 5, 10);
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 0, 0, 0, 3, 3}));
  EXPECT_EQ(plan.row_slot, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(plan.total_dropped(), 0);
  moe_plan_build(plan, index.data(), 0, 1, 5, 0);  // no tokens: a valid, empty plan (rebuilt in place)
  EXPECT_EQ(plan.rows(), 0);
  EXPECT_TRUE(plan.slot_row.empty());
  EXPECT_EQ(plan.offsets.size(), 6u);
}

// Random routing: rows and slots are inverse permutations, each expert's rows are its slots in
// increasing order, and the kept count is min(load, capacity).
TEST(MoePlan, RandomRoutingInvariants) {
  const int64_t N = 257, k = 3, E = 11;
  const CounterRng rng(3, "moe_plan");
  std::vector<int32_t> index(N * k);
  for (int64_t s = 0; s < N * k; ++s) index[s] = int32_t(rng.uniform(s) * double(E));
  for (int64_t capacity : {int64_t{0}, int64_t{40}, int64_t{70}}) {
    MoePlan plan;
    moe_plan_build(plan, index.data(), N, k, E, capacity);
    std::vector<int64_t> load(E, 0);
    for (int32_t e : index) ++load[e];
    int64_t kept_total = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t kept = plan.offsets[e + 1] - plan.offsets[e];
      EXPECT_EQ(kept, capacity > 0 ? std::min(load[e], capacity) : load[e]) << "expert " << e;
      EXPECT_EQ(plan.dropped[e], load[e] - kept);
      kept_total += kept;
      for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
        EXPECT_EQ(index[plan.row_slot[r]], e);
        if (r > plan.offsets[e]) {
          EXPECT_LT(plan.row_slot[r - 1], plan.row_slot[r]);
        }
        EXPECT_EQ(plan.slot_row[plan.row_slot[r]], r);
      }
    }
    EXPECT_EQ(plan.rows(), kept_total);
    EXPECT_EQ(plan.total_dropped(), N * k - kept_total);
    // A dropped slot comes after every kept slot of its expert.
    for (int64_t s = 0; s < N * k; ++s) {
      if (plan.slot_row[s] >= 0) continue;
      const int32_t e = index[s];
      EXPECT_LT(plan.row_slot[plan.offsets[e + 1] - 1], s);
    }
  }
}

TEST(MoeBench, TinyRunReportsAccurateJson) {
  const auto [status, output] =
      test::run_shell(std::string(TRILLION_BINARY) +
                      " bench moe --json --tokens 37 --hidden 24 --experts 6 --top-k 2 --expert-width 20 "
                      "--runs 2 --baseline-runs 2 --gemm-size 128 --seed 3");
  ASSERT_EQ(status, 0) << output;
  const size_t last = output.rfind("\n{");
  ASSERT_NE(last, std::string::npos) << output;
  const nlohmann::json summary = nlohmann::json::parse(output.substr(last + 1));
  EXPECT_EQ(summary.at("bench"), "moe");
  EXPECT_LT(summary.at("max_rel_err").get<double>(), 1e-5);
  for (const char* field : {"speedup", "ceiling_fraction", "ceiling_gflops", "fused_gflops", "memory_ratio"})
    EXPECT_GT(summary.at(field).get<double>(), 0.0) << field;
  EXPECT_EQ(summary.at("tokens").get<int64_t>(), 37);
  EXPECT_EQ(summary.at("hidden").get<int64_t>(), 24);
  EXPECT_EQ(summary.at("experts").get<int64_t>(), 6);
  EXPECT_EQ(summary.at("top_k").get<int64_t>(), 2);
  EXPECT_EQ(summary.at("expert_width").get<int64_t>(), 20);
  EXPECT_DOUBLE_EQ(summary.at("flops").get<double>(), 18.0 * 37 * 2 * 24 * 20);
  // Dropless: every slot is a row; top-k experts are distinct, so no expert sees a token twice.
  EXPECT_EQ(summary.at("rows").get<int64_t>(), 74);
  EXPECT_EQ(summary.at("dropped").get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(summary.at("tokens_per_expert_mean").get<double>(), 74.0 / 6);
  EXPECT_GE(summary.at("tokens_per_expert_max").get<double>(), 74.0 / 6);
  EXPECT_LE(summary.at("tokens_per_expert_max").get<int64_t>(), 37);
  // One line per measurement before the summary.
  for (const char* line :
       {"\"measurement\":\"sgemm_ceiling\"", "\"measurement\":\"fused\"", "\"measurement\":\"fragmented\""})
    EXPECT_NE(output.find(line), std::string::npos) << line;
}

TEST(MoeBench, RejectsTopKAboveExperts) {
  const auto [status, output] =
      test::run_shell(std::string(TRILLION_BINARY) + " bench moe --tokens 8 --experts 4 --top-k 5 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("--top-k 5 must be in [1, --experts 4]"), std::string::npos) << output;
}

}  // namespace
}  // namespace trillion
