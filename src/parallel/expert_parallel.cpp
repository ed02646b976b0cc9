// Expert parallelism: dispatch, the owners' grouped GEMMs, combine, and their backward. See
// expert_parallel.h.
#include "parallel/expert_parallel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

// What one MoE layer keeps from its forward for its backward.
template <class T>
struct LayerState {
  std::vector<int64_t> send_rows, recv_rows;  // [ep] rows to / from each rank of the group
  std::vector<int32_t> recv_expert;           // [R] the local expert of each received row
  Buffer<T> received;                         // [R, H] the rows this rank's experts got
  Buffer<T> gate_up_out, act, expert_out;     // [R, 2I], [R, I], [R, H] the owner-side activations
  Buffer<T> returned;                         // [rows, H] the outputs of this rank's own rows
};

std::vector<int64_t> times(const std::vector<int64_t>& counts, int64_t factor) {
  std::vector<int64_t> out(counts);
  for (int64_t& c : out) c *= factor;
  return out;
}

int64_t sum(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (const int64_t c : counts) total += c;
  return total;
}

// The owner's plan over its received rows: each row one slot of top-k 1, grouped by local expert.
MoePlan owner_plan(const std::vector<int32_t>& recv_expert, int64_t local_experts) {
  MoePlan plan;
  moe_plan_build(plan, recv_expert.data(), static_cast<int64_t>(recv_expert.size()), 1, local_experts, 0);
  return plan;
}

template <class T>
Buffer<T> ones(int64_t count) {
  Buffer<T> values(count);  // [count]
  std::fill(values.data(), values.data() + count, T(1));
  return values;
}

}  // namespace

template <class T>
struct ExpertParallel::Layers {
  std::map<int, LayerState<T>> by_layer;
};

ExpertParallel::ExpertParallel(const ProcessGroup& group) : group_(group) {}
ExpertParallel::~ExpertParallel() = default;

template <>
ExpertParallel::Layers<float>& ExpertParallel::layers<float>() {
  if (!float_layers_) float_layers_ = std::make_unique<Layers<float>>();
  return *float_layers_;
}
template <>
ExpertParallel::Layers<double>& ExpertParallel::layers<double>() {
  if (!double_layers_) double_layers_ = std::make_unique<Layers<double>>();
  return *double_layers_;
}

template <class T>
void ExpertParallel::forward_impl(T* y, const T* x, const T* gate_up, const T* down, const T* weight,
                                  const MoePlan& plan, const MoeExpertDims& dims, int layer) {
  PhaseScope scope(Phase::moe);
  const int ep = group_.size(), me = group_.rank();
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, rows = plan.rows();
  TRILLION_CHECK(E % ep == 0, E, " experts do not split over ", ep, " expert-parallel ranks");
  const int64_t local = E / ep;
  LayerState<T>& st = layers<T>().by_layer[layer];
  st = LayerState<T>{};

  // 1. Row counts: per expert here, per (source, local expert) at the owners.
  std::vector<int64_t> expert_rows(E), recv_counts(E);  // [E] each: [ep, local] blocks
  for (int64_t e = 0; e < E; ++e) expert_rows[e] = plan.offsets[e + 1] - plan.offsets[e];
  group_.all_to_all_counts(expert_rows.data(), recv_counts.data(), local);
  st.send_rows.assign(ep, 0);
  st.recv_rows.assign(ep, 0);
  for (int64_t e = 0; e < E; ++e) {
    st.send_rows[e / local] += expert_rows[e];
    st.recv_rows[e / local] += recv_counts[e];
  }
  const int64_t R = sum(st.recv_rows);
  for (int s = 0; s < ep; ++s)
    for (int64_t e = 0; e < local; ++e) st.recv_expert.insert(st.recv_expert.end(), recv_counts[s * local + e], e);

  // 2. Dispatch: each permuted row carries its token's input.
  Buffer<T> outgoing(rows * H);  // [rows, H]
  parallel_for(rows, [&](int64_t r) {
    const T* in = x + (plan.row_slot[r] / k) * H;
    std::copy(in, in + H, outgoing.data() + r * H);
  });
  st.received = Buffer<T>(R * H);
  group_.all_to_all(outgoing.data(), times(st.send_rows, H), st.received.data(), times(st.recv_rows, H));
  counters_.dispatched_bytes += (rows - st.send_rows[me]) * H * static_cast<int64_t>(sizeof(T));

  // 3. This rank's experts over every row it received.
  const MoePlan owner = owner_plan(st.recv_expert, local);
  const Buffer<T> unit_weight = ones<T>(R);
  Buffer<T> out_rows(R * H);  // [R, H] (zero: the kernel adds 1 · out)
  st.gate_up_out = Buffer<T>(R * 2 * I);
  st.act = Buffer<T>(R * I);
  st.expert_out = Buffer<T>(R * H);
  moe_experts_forward(out_rows.data(), st.gate_up_out.data(), st.act.data(), st.expert_out.data(), st.received.data(),
                      gate_up + me * local * 2 * I * H, down + me * local * H * I, unit_weight.data(), owner,
                      MoeExpertDims{H, I, local});

  // 4. Combine: the outputs back, weighted into y token by token.
  st.returned = Buffer<T>(rows * H);
  group_.all_to_all(out_rows.data(), times(st.recv_rows, H), st.returned.data(), times(st.send_rows, H));
  counters_.combined_bytes += (R - st.recv_rows[me]) * H * static_cast<int64_t>(sizeof(T));
  parallel_for(plan.tokens, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      if (r < 0) continue;  // dropped by the capacity
      const T w = weight[t * k + j];
      const T* out = st.returned.data() + r * H;
      for (int64_t c = 0; c < H; ++c) y[t * H + c] += w * out[c];
    }
  });
}

template <class T>
void ExpertParallel::backward_impl(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* gate_up,
                                   const T* down, const T* weight, const MoePlan& plan, const MoeExpertDims& dims,
                                   int layer) {
  PhaseScope scope(Phase::moe);
  const int ep = group_.size(), me = group_.rank();
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, rows = plan.rows();
  const int64_t local = E / ep;
  auto found = layers<T>().by_layer.find(layer);
  TRILLION_CHECK(found != layers<T>().by_layer.end(), "expert-parallel backward of layer ", layer, " without its forward");
  LayerState<T>& st = found->second;
  const int64_t R = static_cast<int64_t>(st.recv_expert.size());

  // The combine's backward: dweight here, the weighted output gradients to the owners.
  Buffer<T> d_rows(rows * H);  // [rows, H]
  parallel_for(plan.tokens, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = t * k + j;
      const int32_t r = plan.slot_row[slot];
      if (r < 0) {
        dweight[slot] = T(0);
        continue;
      }
      const T* out = st.returned.data() + r * H;
      T dot = T(0);
      for (int64_t c = 0; c < H; ++c) {
        dot += dy[t * H + c] * out[c];
        d_rows[r * H + c] = weight[slot] * dy[t * H + c];
      }
      dweight[slot] = dot;
    }
  });
  Buffer<T> dy_received(R * H);  // [R, H]
  group_.all_to_all(d_rows.data(), times(st.send_rows, H), dy_received.data(), times(st.recv_rows, H));
  counters_.dispatched_bytes += (rows - st.send_rows[me]) * H * static_cast<int64_t>(sizeof(T));

  // The owners' expert backward: input gradients of their rows, their experts' weight gradients.
  const MoePlan owner = owner_plan(st.recv_expert, local);
  const Buffer<T> unit_weight = ones<T>(R);
  Buffer<T> dx_received(R * H);  // [R, H] (zero: the kernel accumulates)
  Buffer<T> unused_dweight(R);   // [R] <dy, out> of the unit weights
  moe_experts_backward(dx_received.data(), unused_dweight.data(),
                       dgate_up != nullptr ? dgate_up + me * local * 2 * I * H : nullptr,
                       ddown != nullptr ? ddown + me * local * H * I : nullptr, dy_received.data(), st.received.data(),
                       st.gate_up_out.data(), st.act.data(), st.expert_out.data(), gate_up + me * local * 2 * I * H,
                       down + me * local * H * I, unit_weight.data(), owner, MoeExpertDims{H, I, local});

  // The dispatch's backward: the input gradients back, summed into dx token by token.
  Buffer<T> dx_rows(rows * H);  // [rows, H]
  group_.all_to_all(dx_received.data(), times(st.recv_rows, H), dx_rows.data(), times(st.send_rows, H));
  counters_.combined_bytes += (R - st.recv_rows[me]) * H * static_cast<int64_t>(sizeof(T));
  parallel_for(plan.tokens, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      if (r < 0) continue;
      for (int64_t c = 0; c < H; ++c) dx[t * H + c] += dx_rows[r * H + c];
    }
  });
  layers<T>().by_layer.erase(found);
}

void ExpertParallel::forward(float* y, const float* x, const float* gate_up, const float* down, const float* weight,
                             const MoePlan& plan, const MoeExpertDims& dims, int layer) {
  forward_impl(y, x, gate_up, down, weight, plan, dims, layer);
}
void ExpertParallel::forward(double* y, const double* x, const double* gate_up, const double* down,
                             const double* weight, const MoePlan& plan, const MoeExpertDims& dims, int layer) {
  forward_impl(y, x, gate_up, down, weight, plan, dims, layer);
}
void ExpertParallel::backward(float* dx, float* dweight, float* dgate_up, float* ddown, const float* dy,
                              const float* gate_up, const float* down, const float* weight, const MoePlan& plan,
                              const MoeExpertDims& dims, int layer) {
  backward_impl(dx, dweight, dgate_up, ddown, dy, gate_up, down, weight, plan, dims, layer);
}
void ExpertParallel::backward(double* dx, double* dweight, double* dgate_up, double* ddown, const double* dy,
                              const double* gate_up, const double* down, const double* weight, const MoePlan& plan,
                              const MoeExpertDims& dims, int layer) {
  backward_impl(dx, dweight, dgate_up, ddown, dy, gate_up, down, weight, plan, dims, layer);
}

}  // namespace trillion
