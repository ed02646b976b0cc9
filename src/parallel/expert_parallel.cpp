// Expert parallelism: dispatch, the owners' grouped GEMMs, combine, and their backward, pipelined
// over token chunks. See expert_parallel.h.
#include "parallel/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

// One chunk of one MoE layer: its rows on the way out and what came back, and the rows its owners
// received, with their activations.
template <class T>
struct Chunk {
  std::vector<int32_t> rows;                  // plan rows of the chunk's tokens, expert-major
  std::vector<int64_t> send_rows, recv_rows;  // [ep] rows to / from each rank of the group
  std::vector<int32_t> recv_expert;           // [R] the local expert of each received row
  Buffer<T> received;                         // [R, H] the rows this rank's experts got
  Buffer<T> gate_up_out, act, expert_out;     // [R, 2I], [R, I], [R, H] the owner-side activations
  Buffer<T> returned;                         // [rows, H] the outputs of the chunk's own rows
};

// What one MoE layer keeps from its forward for its backward.
template <class T>
struct LayerState {
  std::vector<Chunk<T>> chunks;
  std::vector<int32_t> row_chunk, row_position;  // [plan rows] the chunk of each row and its place there
};

std::vector<int64_t> times(const std::vector<int64_t>& counts, int64_t factor) {
  std::vector<int64_t> out(counts);
  for (int64_t& c : out) c *= factor;
  return out;
}

// The owner's plan over its received rows: each row one slot of top-k 1, grouped by local expert.
MoePlan owner_plan(const std::vector<int32_t>& recv_expert, int64_t local_experts) {
  MoePlan plan;
  moe_plan_build(plan, recv_expert.data(), static_cast<int64_t>(recv_expert.size()), 1, local_experts, 0);
  return plan;
}

// The chunks' exchanges as a pipeline: chunk c + 1's dispatch is started before chunk c's is
// finished and chunk c's compute starts its combine; every combine is finished at the end.
// start(c) and compute(c) return their exchange in flight; finish completes one.
template <class Start, class Compute, class Finish>
void pipeline(int64_t chunks, const Start& start, const Compute& compute, const Finish& finish) {
  std::vector<ProcessGroup::Pending> dispatch(chunks), combine(chunks);
  dispatch[0] = start(0);
  for (int64_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) dispatch[c + 1] = start(c + 1);
    finish(dispatch[c]);
    combine[c] = compute(c);
  }
  for (int64_t c = 0; c < chunks; ++c) finish(combine[c]);
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

ExpertParallel::ExpertParallel(const ProcessGroup& group, int chunks) : group_(group) { set_chunks(chunks); }
ExpertParallel::~ExpertParallel() = default;

void ExpertParallel::finish_timed(ProcessGroup::Pending& pending) {
  const auto start = std::chrono::steady_clock::now();
  group_.finish(pending);
  counters_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ExpertParallel::set_chunks(int chunks) {
  if (chunks < 1) fail("expert-parallel chunks must be ≥ 1, got ", chunks);
  chunks_ = chunks;
}

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
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, N = plan.tokens;
  TRILLION_CHECK(E % ep == 0, E, " experts do not split over ", ep, " expert-parallel ranks");
  const int64_t local = E / ep, C = std::max<int64_t>(1, std::min<int64_t>(chunks_, N));
  LayerState<T>& st = layers<T>().by_layer[layer];
  st = LayerState<T>{};
  st.chunks.resize(C);
  st.row_chunk.assign(plan.rows(), 0);
  st.row_position.assign(plan.rows(), 0);

  // Each chunk's rows (tokens [c·N/C, (c+1)·N/C)), in one walk over the plan's expert-major rows,
  // so each chunk's rows stay expert-major; their counts per expert exchanged up front.
  std::vector<std::vector<int64_t>> expert_rows(C, std::vector<int64_t>(E, 0));  // [C][E]
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
      const int64_t token = plan.row_slot[r] / k, c = ((token + 1) * C - 1) / N;  // c·N/C ≤ token < (c+1)·N/C
      Chunk<T>& ch = st.chunks[c];
      st.row_chunk[r] = static_cast<int32_t>(c);
      st.row_position[r] = static_cast<int32_t>(ch.rows.size());
      ch.rows.push_back(static_cast<int32_t>(r));
      ++expert_rows[c][e];
    }
  std::vector<Buffer<T>> outgoing(C);
  for (int64_t c = 0; c < C; ++c) {
    Chunk<T>& ch = st.chunks[c];
    std::vector<int64_t> recv_counts(E);  // [E]: [ep, local] blocks
    group_.all_to_all_counts(expert_rows[c].data(), recv_counts.data(), local);
    ch.send_rows.assign(ep, 0);
    ch.recv_rows.assign(ep, 0);
    for (int64_t e = 0; e < E; ++e) {
      ch.send_rows[e / local] += expert_rows[c][e];
      ch.recv_rows[e / local] += recv_counts[e];
    }
    for (int s = 0; s < ep; ++s)
      for (int64_t e = 0; e < local; ++e) ch.recv_expert.insert(ch.recv_expert.end(), recv_counts[s * local + e], e);
    const int64_t rows = static_cast<int64_t>(ch.rows.size()), R = static_cast<int64_t>(ch.recv_expert.size());
    outgoing[c] = Buffer<T>(rows * H);  // [rows, H] each row carries its token's input
    parallel_for(rows, [&](int64_t i) {
      const T* in = x + (plan.row_slot[ch.rows[i]] / k) * H;
      std::copy(in, in + H, outgoing[c].data() + i * H);
    });
    ch.received = Buffer<T>(R * H);
    ch.returned = Buffer<T>(rows * H);
    counters_.dispatched_bytes += (rows - ch.send_rows[me]) * H * static_cast<int64_t>(sizeof(T));
    counters_.combined_bytes += (R - ch.recv_rows[me]) * H * static_cast<int64_t>(sizeof(T));
  }

  // The pipeline: chunk c + 1's dispatch and chunk c − 1's combine in flight during chunk c's experts.
  std::vector<Buffer<T>> out_rows(C);
  const auto start = [&](int64_t c) {
    Chunk<T>& ch = st.chunks[c];
    return group_.start_all_to_all(outgoing[c].data(), times(ch.send_rows, H), ch.received.data(),
                                   times(ch.recv_rows, H));
  };
  const auto compute = [&](int64_t c) {
    Chunk<T>& ch = st.chunks[c];
    const int64_t R = static_cast<int64_t>(ch.recv_expert.size());
    const Buffer<T> unit_weight = ones<T>(R);
    out_rows[c] = Buffer<T>(R * H);  // [R, H] (zero: the kernel adds 1 · out)
    ch.gate_up_out = Buffer<T>(R * 2 * I);
    ch.act = Buffer<T>(R * I);
    ch.expert_out = Buffer<T>(R * H);
    moe_experts_forward(out_rows[c].data(), ch.gate_up_out.data(), ch.act.data(), ch.expert_out.data(),
                        ch.received.data(), gate_up + me * local * 2 * I * H, down + me * local * H * I,
                        unit_weight.data(), owner_plan(ch.recv_expert, local), MoeExpertDims{H, I, local});
    return group_.start_all_to_all(out_rows[c].data(), times(ch.recv_rows, H), ch.returned.data(),
                                   times(ch.send_rows, H));
  };
  pipeline(C, start, compute, [&](ProcessGroup::Pending& p) { finish_timed(p); });

  // y[t] += Σ_j weight[t, j] · out(t, j), j in order.
  parallel_for(N, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      if (r < 0) continue;  // dropped by the capacity
      const T w = weight[t * k + j];
      const T* out = st.chunks[st.row_chunk[r]].returned.data() + st.row_position[r] * H;
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
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, N = plan.tokens;
  const int64_t local = E / ep;
  auto found = layers<T>().by_layer.find(layer);
  TRILLION_CHECK(found != layers<T>().by_layer.end(), "expert-parallel backward of layer ", layer, " without its forward");
  LayerState<T>& st = found->second;
  const int64_t C = static_cast<int64_t>(st.chunks.size());

  // The combine's backward: dweight here, the weighted output gradients of each chunk's rows.
  std::vector<Buffer<T>> d_rows(C);
  for (int64_t c = 0; c < C; ++c) d_rows[c] = Buffer<T>(static_cast<int64_t>(st.chunks[c].rows.size()) * H);
  parallel_for(N, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = t * k + j;
      const int32_t r = plan.slot_row[slot];
      if (r < 0) {
        dweight[slot] = T(0);
        continue;
      }
      const Chunk<T>& ch = st.chunks[st.row_chunk[r]];
      const T* out = ch.returned.data() + st.row_position[r] * H;
      T* d = d_rows[st.row_chunk[r]].data() + st.row_position[r] * H;
      T dot = T(0);
      for (int64_t c = 0; c < H; ++c) {
        dot += dy[t * H + c] * out[c];
        d[c] = weight[slot] * dy[t * H + c];
      }
      dweight[slot] = dot;
    }
  });

  // The pipeline as in forward: dispatch the output gradients, the owners' expert backward (weight
  // gradients summed chunk by chunk), the input gradients back.
  std::vector<Buffer<T>> dy_received(C), dx_received(C), dx_rows(C);
  const auto start = [&](int64_t c) {
    Chunk<T>& ch = st.chunks[c];
    dy_received[c] = Buffer<T>(static_cast<int64_t>(ch.recv_expert.size()) * H);
    return group_.start_all_to_all(d_rows[c].data(), times(ch.send_rows, H), dy_received[c].data(),
                                   times(ch.recv_rows, H));
  };
  const auto compute = [&](int64_t c) {
    Chunk<T>& ch = st.chunks[c];
    const int64_t rows = static_cast<int64_t>(ch.rows.size()), R = static_cast<int64_t>(ch.recv_expert.size());
    const Buffer<T> unit_weight = ones<T>(R);
    dx_received[c] = Buffer<T>(R * H);  // [R, H] (zero: the kernel accumulates)
    Buffer<T> unused_dweight(R);        // [R] <dy, out> of the unit weights
    moe_experts_backward(dx_received[c].data(), unused_dweight.data(),
                         dgate_up != nullptr ? dgate_up + me * local * 2 * I * H : nullptr,
                         ddown != nullptr ? ddown + me * local * H * I : nullptr, dy_received[c].data(),
                         ch.received.data(), ch.gate_up_out.data(), ch.act.data(), ch.expert_out.data(),
                         gate_up + me * local * 2 * I * H, down + me * local * H * I, unit_weight.data(),
                         owner_plan(ch.recv_expert, local), MoeExpertDims{H, I, local});
    dx_rows[c] = Buffer<T>(rows * H);
    counters_.dispatched_bytes += (rows - ch.send_rows[me]) * H * static_cast<int64_t>(sizeof(T));
    counters_.combined_bytes += (R - ch.recv_rows[me]) * H * static_cast<int64_t>(sizeof(T));
    return group_.start_all_to_all(dx_received[c].data(), times(ch.recv_rows, H), dx_rows[c].data(),
                                   times(ch.send_rows, H));
  };
  pipeline(C, start, compute, [&](ProcessGroup::Pending& p) { finish_timed(p); });

  // dx[t] += the input gradients of its rows, j in order.
  parallel_for(N, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      if (r < 0) continue;
      const T* d = dx_rows[st.row_chunk[r]].data() + st.row_position[r] * H;
      for (int64_t c = 0; c < H; ++c) dx[t * H + c] += d[c];
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
