// MLA's weight-absorbed form (model/mla_absorbed.h) against the expanded form it replaces under
// context parallelism, in double at odd sizes: attention over the rows [e | k_rot] with the queries
// absorbed through kv_b_proj gives the expanded keys' outputs and log-sum-exp, and its backward every
// gradient (q, c, k_rot, kv_b_proj, and an adapter's A and B, with and without dropout), to rounding.
#include "model/mla_absorbed.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/memory.h"
#include "model/linear.h"
#include "ops/attention.h"
#include "ops/finite_diff.h"

namespace trillion {
namespace {

using test::random_values;
using test::relative_error;

struct Case {
  int64_t rank;    // the adapter's on kv_b_proj (0: none)
  double dropout;  // its lora_dropout, under a pass
};

MlaDims dims_of(int64_t rank) {
  MlaDims dims;
  dims.heads = 3, dims.nope = 3, dims.rope_dim = 2, dims.v = 4, dims.kv_lora_rank = 5;
  dims.kv_b_adapter_rank = rank;
  dims.scale = 0.41;
  return dims;
}

// Everything the two forms are compared on, for one causal sequence of n tokens.
struct Result {
  std::vector<double> out, lse, dq, dc, d_rot, dw, da, db;
};

class MlaAbsorbed : public testing::TestWithParam<Case> {
 protected:
  static constexpr int64_t n = 7;
  MlaDims dims = dims_of(GetParam().rank);
  const int64_t H = dims.heads, qk = dims.qk(), rkv = dims.kv_lora_rank, rope = dims.rope_dim, dv = dims.v;
  const int64_t rank = dims.kv_b_adapter_rank, out_rows = dims.kv_b_out();
  std::vector<double> q = random_values(n * H * qk, 1);            // [n, H, qk]
  std::vector<double> c = random_values(n * rkv, 2);               // [n, r_kv]
  std::vector<double> kv_a = random_values(n * (rkv + rope), 3);   // [n, r_kv + rope]: its k_rot is read
  std::vector<double> w = random_values(out_rows * rkv, 4, 0.5);   // [H·(nope + v), r_kv]
  std::vector<double> a = random_values(rank * rkv, 5, 0.5);       // [r_a, r_kv]
  std::vector<double> b = random_values(out_rows * rank, 6, 0.5);  // [H·(nope + v), r_a]
  std::vector<double> d_out = random_values(n * H * dv, 7);        // [n, H, v]
  LoraDropoutPass dropout_pass{.seed = 11, .step = 3};

  LinearWeights<double> weights() {
    LinearWeights<double> kv_b{w.data(), nullptr, {}};
    if (rank > 0) kv_b.lora = {a.data(), b.data(), rank, 0.75, GetParam().dropout, 0x5eed};
    return kv_b;
  }
  // Zeroed gradients of the same layout, in r.
  LinearWeights<double> gradients(Result& r) {
    r.dw.assign(w.size(), 0.0), r.da.assign(a.size(), 0.0), r.db.assign(b.size(), 0.0);
    LinearWeights<double> g{r.dw.data(), nullptr, {}};
    if (rank > 0) g.lora = {r.da.data(), r.db.data(), rank, 0.75};
    return g;
  }

  // The expanded form: kv = kv_b_proj(c), keys [k_nope | k_rot] per head, values.
  Result expanded() {
    Result r;
    const LinearWeights<double> kv_b = weights();
    std::vector<double> kv(n * out_rows), k(n * H * qk), v(n * H * dv);
    linear(kv.data(), c.data(), kv_b, n, rkv, out_rows, false);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hd = 0; hd < H; ++hd) {
        const double* row = kv.data() + (t * H + hd) * (dims.nope + dv);
        std::memcpy(k.data() + (t * H + hd) * qk, row, dims.nope * sizeof(double));
        std::memcpy(k.data() + (t * H + hd) * qk + dims.nope, kv_a.data() + t * (rkv + rope) + rkv,
                    rope * sizeof(double));
        std::memcpy(v.data() + (t * H + hd) * dv, row + dims.nope, dv * sizeof(double));
      }
    const AttentionSizes sizes{1, n, n, H, H, qk, dims.scale, dv};
    r.out.resize(n * H * dv), r.lse.resize(H * n);
    attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), sizes);
    std::vector<double> dk(k.size()), d_v(v.size()), d_kv(kv.size());
    r.dq.resize(q.size());
    attention_backward(r.dq.data(), dk.data(), d_v.data(), d_out.data(), q.data(), k.data(), v.data(), r.out.data(),
                       r.lse.data(), sizes);
    r.d_rot.assign(n * rope, 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hd = 0; hd < H; ++hd) {
        double* row = d_kv.data() + (t * H + hd) * (dims.nope + dv);
        std::memcpy(row, dk.data() + (t * H + hd) * qk, dims.nope * sizeof(double));
        std::memcpy(row + dims.nope, d_v.data() + (t * H + hd) * dv, dv * sizeof(double));
        for (int64_t i = 0; i < rope; ++i) r.d_rot[t * rope + i] += dk[(t * H + hd) * qk + dims.nope + i];
      }
    r.dc.resize(c.size());
    linear_grad(r.dc.data(), gradients(r), d_kv.data(), c.data(), kv_b, n, rkv, out_rows, false);
    return r;
  }

  // The absorbed form: one key head of rows [e | k_rot], values e, the output mapped back.
  Result absorbed() {
    Result r;
    Arena scratch;
    const LinearWeights<double> kv_b = weights();
    const int64_t width = dims.absorbed_latent(), row = dims.absorbed_row();
    std::vector<double> rows(n * row), values(n * width), q_abs(n * H * row), out_latent(n * H * width);
    latent_rows(rows.data(), c.data(), kv_a.data(), kv_b, n, dims);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(values.data() + t * width, rows.data() + t * row, width * sizeof(double));
    const double* w_e = absorbed_weight(kv_b, dims, scratch);
    absorb_queries(q_abs.data(), q.data(), w_e, width, n, dims);
    const AttentionSizes sizes{1, n, n, H, 1, row, dims.scale, width};
    r.lse.resize(H * n), r.out.resize(n * H * dv);
    attention_forward(out_latent.data(), r.lse.data(), q_abs.data(), rows.data(), values.data(), sizes);
    expand_outputs(r.out.data(), out_latent.data(), w_e, width, n, dims);

    std::vector<double> d_out_latent(out_latent.size()), dw_e(out_rows * width, 0.0);
    std::vector<double> dq_abs(q_abs.size()), d_rows(rows.size()), d_values(values.size());
    expand_outputs_backward(d_out_latent.data(), dw_e.data(), d_out.data(), out_latent.data(), w_e, width, n, dims);
    attention_backward(dq_abs.data(), d_rows.data(), d_values.data(), d_out_latent.data(), q_abs.data(), rows.data(),
                       values.data(), out_latent.data(), r.lse.data(), sizes);
    r.dq.resize(q.size());
    absorb_queries_backward(r.dq.data(), dw_e.data(), dq_abs.data(), q.data(), w_e, width, n, dims);
    absorbed_weight_grad(gradients(r), dw_e.data(), dims);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < width; ++i) d_rows[t * row + i] += d_values[t * width + i];
    std::vector<double> d_kv_a(kv_a.size());
    r.dc.resize(c.size());
    LinearWeights<double> g{nullptr, nullptr, {}};
    if (rank > 0) g.lora.a = r.da.data();
    latent_rows_backward(r.dc.data(), d_kv_a.data(), g, d_rows.data(), c.data(), kv_b, n, dims);
    r.d_rot.resize(n * rope);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(r.d_rot.data() + t * rope, d_kv_a.data() + t * (rkv + rope) + rkv, rope * sizeof(double));
    return r;
  }
};

TEST_P(MlaAbsorbed, EqualsTheExpandedFormAndItsGradients) {
  const LoraDropoutScope scope(GetParam().dropout > 0.0 ? &dropout_pass : nullptr);
  const Result want = expanded(), got = absorbed();
  EXPECT_LT(relative_error(got.out, want.out), 1e-13);
  EXPECT_LT(relative_error(got.lse, want.lse), 1e-13);
  EXPECT_LT(relative_error(got.dq, want.dq), 1e-13);
  EXPECT_LT(relative_error(got.dc, want.dc), 1e-13);
  EXPECT_LT(relative_error(got.d_rot, want.d_rot), 1e-13);
  EXPECT_LT(relative_error(got.dw, want.dw), 1e-13);
  if (rank > 0) {
    EXPECT_LT(relative_error(got.da, want.da), 1e-13);
    EXPECT_LT(relative_error(got.db, want.db), 1e-13);
  }
}

INSTANTIATE_TEST_SUITE_P(Adapters, MlaAbsorbed,
                         testing::Values(Case{0, 0.0}, Case{2, 0.0}, Case{2, 0.25}, Case{6, 0.5}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return "rank" + std::to_string(info.param.rank) +
                                  (info.param.dropout > 0.0 ? "_dropout" : "");
                         });

}  // namespace
}  // namespace trillion
