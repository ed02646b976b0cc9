// Expert parallelism: dispatch, the owners' grouped GEMMs, combine, and their backward, pipelined
// over token chunks. See expert_parallel.h.
#include "parallel/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/phase_clock.h"

namespace trillion {
namespace {

// The plan's rows cut into token chunks (chunk c: tokens [c·N/C, (c+1)·N/C)) in one walk over its
// expert-major rows, so each chunk's rows stay expert-major; the order of the layer's own rows in
// the dispatch and in the returned outputs. Built alike in forward and backward from the plan.
struct ChunkedRows {
  std::vector<int64_t> first;                // [C + 1] each chunk's first place
  std::vector<int32_t> row;                  // [rows] the plan row at each place
  std::vector<int32_t> place;                // [plan rows] the place of each plan row
  std::vector<std::vector<int64_t>> expert;  // [C][E] rows per expert in each chunk
  std::vector<std::vector<int64_t>> sent;    // [C][ep] rows to each rank of the group
};

ChunkedRows chunk_rows(const MoePlan& plan, int64_t C, int64_t E, int ep) {
  const int64_t k = plan.top_k, N = plan.tokens, local = E / ep;
  ChunkedRows out;
  out.expert.assign(C, std::vector<int64_t>(E, 0));
  out.sent.assign(C, std::vector<int64_t>(ep, 0));
  std::vector<std::vector<int32_t>> rows(C);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
      const int64_t token = plan.row_slot[r] / k, c = ((token + 1) * C - 1) / N;  // c·N/C ≤ token < (c+1)·N/C
      rows[c].push_back(static_cast<int32_t>(r));
      ++out.expert[c][e];
      ++out.sent[c][e / local];
    }
  out.first.assign(C + 1, 0);
  out.place.assign(plan.rows(), 0);
  for (int64_t c = 0; c < C; ++c) {
    out.first[c + 1] = out.first[c] + static_cast<int64_t>(rows[c].size());
    for (const int32_t r : rows[c]) {
      out.place[r] = static_cast<int32_t>(out.row.size());
      out.row.push_back(r);
    }
  }
  return out;
}

// The rows this rank's experts receive, from their source codes (model/step.h's ExchangedRows):
// chunk-major, then by source rank, then by local expert.
struct ReceivedRows {
  std::vector<int64_t> first;                // [C + 1] each chunk's first received row
  std::vector<std::vector<int64_t>> from;    // [C][ep] rows from each rank of the group
  std::vector<std::vector<int32_t>> expert;  // [C][R_c] the local expert of each row
};

ReceivedRows received_rows(const int32_t* source, int64_t R, int64_t C, int ep, int64_t local) {
  ReceivedRows out;
  out.first.assign(C + 1, 0);
  out.from.assign(C, std::vector<int64_t>(ep, 0));
  out.expert.assign(C, {});
  for (int64_t i = 0; i < R; ++i) {
    const int64_t c = source[i] / local / ep, s = source[i] / local % ep;
    TRILLION_CHECK(c < C, "an exchanged row of chunk ", c, " in a backward of ", C, " chunks");
    ++out.from[c][s];
    out.expert[c].push_back(static_cast<int32_t>(source[i] % local));
    ++out.first[c + 1];
  }
  for (int64_t c = 0; c < C; ++c) out.first[c + 1] += out.first[c];
  return out;
}

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

std::vector<ExchangeBytes> exchange_bytes(const std::vector<std::vector<std::vector<double>>>& loads, int ep,
                                          int64_t hidden, int64_t element_bytes) {
  const int ranks = loads.empty() ? 0 : static_cast<int>(loads[0].size());
  TRILLION_CHECK(ep > 0 && ranks % ep == 0, "exchange_bytes: ", ranks, " ranks' loads for ep ", ep);
  std::vector<ExchangeBytes> bytes(ranks);
  const double per_row = double((2 * hidden + 1) * element_bytes);
  for (const std::vector<std::vector<double>>& layer : loads) {
    TRILLION_CHECK(static_cast<int>(layer.size()) == ranks, "exchange_bytes: a layer's loads of ", layer.size(),
                   " ranks, not ", ranks);
    for (int r = 0; r < ranks; ++r) {
      const int64_t E = static_cast<int64_t>(layer[r].size()), local = E / ep;
      TRILLION_CHECK(E % ep == 0, "exchange_bytes: ", E, " experts over ep ", ep);
      for (int64_t e = 0; e < E; ++e) {
        const int owner = (r / ep) * ep + static_cast<int>(e / local);  // the rank of e's slice in r's ep group
        if (owner == r) continue;                                   // rows to itself never leave it
        bytes[r].dispatched += layer[r][e] * per_row;
        bytes[owner].combined += layer[r][e] * per_row;
      }
    }
  }
  return bytes;
}

ExpertParallel::ExpertParallel(const ProcessGroup& group, int chunks) : group_(group) { set_chunks(chunks); }

void ExpertParallel::finish_timed(ProcessGroup::Pending& pending) {
  const auto start = std::chrono::steady_clock::now();
  group_.finish(pending);
  counters_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ExpertParallel::set_chunks(int chunks) {
  if (chunks < 1) fail("expert-parallel chunks must be ≥ 1, got ", chunks);
  chunks_ = chunks;
}

int64_t ExpertParallel::chunks_of(int64_t tokens) const {
  return std::max<int64_t>(1, std::min<int64_t>(chunks_, tokens));
}

// The pairs of the experts from `first` on: each [E, …] tensor's slice (a null gradient stays null).
template <class T>
ExpertAdapters<T> experts_from(const ExpertAdapters<T>& all, int64_t first, int64_t hidden, int64_t intermediate) {
  ExpertAdapters<T> local = all;
  const auto shift = [&](std::vector<ExpertLoraPair<T>>& pairs, int64_t in) {
    for (ExpertLoraPair<T>& pair : pairs) {
      if (pair.a != nullptr) pair.a += first * pair.rank * in;   // [E, r, in]
      if (pair.b != nullptr) pair.b += first * pair.rows * pair.rank;  // [E, rows, r]
    }
  };
  shift(local.gate_up, hidden);
  shift(local.down, intermediate);
  return local;
}

template <class T>
void ExpertParallel::forward_impl(T* y, const T* x, const T* gate_up, const T* down, const T* weight,
                                  const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<T>& adapters,
                                  const ExchangedRowsFor<T>& save) {
  PhaseScope scope(Phase::moe);
  const int ep = group_.size(), me = group_.rank();
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, N = plan.tokens;
  TRILLION_CHECK(E % ep == 0, E, " experts do not split over ", ep, " expert-parallel ranks");
  const int64_t local = E / ep, C = chunks_of(N);
  TRILLION_CHECK(C * E <= std::numeric_limits<int32_t>::max(), C, " chunks of ", E,
                 " experts overflow the exchanged rows' sources");
  const ChunkedRows own = chunk_rows(plan, C, E, ep);

  // Each chunk's counts per expert, exchanged up front: the received rows' sources, then their buffers.
  std::vector<int32_t> source;  // [R]
  for (int64_t c = 0; c < C; ++c) {
    std::vector<int64_t> recv_counts(E);  // [E]: [ep, local] blocks
    group_.all_to_all_counts(own.expert[c].data(), recv_counts.data(), local);
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < local; ++e)
        source.insert(source.end(), recv_counts[s * local + e], static_cast<int32_t>((c * ep + s) * local + e));
  }
  const ExchangedRows<T> rows = save(static_cast<int64_t>(source.size()));
  std::copy(source.begin(), source.end(), rows.source);
  const ReceivedRows received = received_rows(rows.source, rows.received, C, ep, local);
  const int64_t own_rows = plan.rows();
  Buffer<T> outgoing(own_rows * H);  // [rows, H] each row carries its token's input
  Buffer<T> outgoing_weight(own_rows);  // [rows] and its combine weight
  parallel_for(own_rows, H, [&](int64_t i) {
    const int64_t slot = plan.row_slot[own.row[i]];
    const T* in = x + (slot / k) * H;
    std::copy(in, in + H, outgoing.data() + i * H);
    outgoing_weight.data()[i] = weight[slot];
  });
  // The weights go to the owners first (one value per row), for the backward they run there.
  for (int64_t c = 0; c < C; ++c) {
    ProcessGroup::Pending p = group_.start_all_to_all(outgoing_weight.data() + own.first[c], own.sent[c],
                                                      rows.weight + received.first[c], received.from[c]);
    finish_timed(p);
  }
  int64_t to_me = 0, from_me = 0;  // rows this rank sends to itself: they never leave it
  for (int64_t c = 0; c < C; ++c) {
    to_me += own.sent[c][me];
    from_me += received.from[c][me];
  }
  counters_.dispatched_bytes += (own_rows - to_me) * (H + 1) * static_cast<int64_t>(sizeof(T));
  counters_.combined_bytes += (rows.received - from_me) * H * static_cast<int64_t>(sizeof(T));

  // The pipeline: chunk c + 1's dispatch and chunk c − 1's combine in flight during chunk c's experts.
  Buffer<T> out_rows(rows.received * H);  // [R, H] the experts' outputs (zero: the kernel adds 1 · out)
  Buffer<T> returned(own_rows * H);       // [rows, H] the own rows' outputs, back from their owners
  const auto start = [&](int64_t c) {
    const int64_t at = received.first[c];
    return group_.start_all_to_all(outgoing.data() + own.first[c] * H, times(own.sent[c], H),
                                   rows.rows_in + at * H, times(received.from[c], H));
  };
  const auto compute = [&](int64_t c) {
    const int64_t at = received.first[c], R = received.first[c + 1] - at;
    const Buffer<T> unit_weight = ones<T>(R);
    moe_experts_forward(out_rows.data() + at * H, rows.gate_up_out + at * 2 * I, rows.act + at * I,
                        rows.rows_in + at * H, gate_up + me * local * 2 * I * H,
                        down + me * local * H * I, unit_weight.data(), owner_plan(received.expert[c], local),
                        MoeExpertDims{H, I, local, dims.adapter_rank}, experts_from(adapters, me * local, H, I));
    return group_.start_all_to_all(out_rows.data() + at * H, times(received.from[c], H),
                                   returned.data() + own.first[c] * H, times(own.sent[c], H));
  };
  pipeline(C, start, compute, [&](ProcessGroup::Pending& p) { finish_timed(p); });

  // y[t] += Σ_j weight[t, j] · out(t, j), j in order.
  parallel_for(N, k * H, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      if (r < 0) continue;  // dropped by the capacity
      const T w = weight[t * k + j];
      const T* out = returned.data() + own.place[r] * H;
      for (int64_t c = 0; c < H; ++c) y[t * H + c] += w * out[c];
    }
  });
}

template <class T>
void ExpertParallel::backward_impl(T* dx, T* dweight, T* dgate_up, T* ddown, const T* dy, const T* gate_up,
                                   const T* down, const T* weight, const MoePlan& plan, const MoeExpertDims& dims,
                                   const ExpertAdapters<T>& adapters, const ExpertAdapters<T>& adapter_grads,
                                   const ExchangedRows<const T>& saved) {
  PhaseScope scope(Phase::moe);
  const int ep = group_.size(), me = group_.rank();
  const int64_t E = dims.experts, H = dims.hidden, I = dims.intermediate, k = plan.top_k, N = plan.tokens;
  const int64_t local = E / ep, C = chunks_of(N), own_rows = plan.rows();
  const ChunkedRows own = chunk_rows(plan, C, E, ep);
  const ReceivedRows received = received_rows(saved.source, saved.received, C, ep, local);

  // The combine's backward starts at the owners, which hold the rows' weights: each own row carries
  // its token's output gradient, unweighted.
  Buffer<T> d_rows(own_rows * H);  // [rows, H]
  parallel_for(own_rows, H, [&](int64_t i) {
    const T* d = dy + (plan.row_slot[own.row[i]] / k) * H;
    std::copy(d, d + H, d_rows.data() + i * H);
  });

  // The pipeline as in forward: dispatch the output gradients, the owners' expert backward (weight
  // gradients summed chunk by chunk; each row's dweight as one rank forms it), the input gradients
  // back; then the dweights back.
  Buffer<T> dy_received(saved.received * H), dx_received(saved.received * H);  // [R, H] each
  Buffer<T> dweight_received(saved.received);                                  // [R]
  Buffer<T> dx_rows(own_rows * H), dweight_rows(own_rows);                     // [rows, H], [rows]
  const auto start = [&](int64_t c) {
    return group_.start_all_to_all(d_rows.data() + own.first[c] * H, times(own.sent[c], H),
                                   dy_received.data() + received.first[c] * H, times(received.from[c], H));
  };
  const auto compute = [&](int64_t c) {
    const int64_t at = received.first[c], R = received.first[c + 1] - at;
    moe_experts_backward(dx_received.data() + at * H, dweight_received.data() + at,
                         dgate_up != nullptr ? dgate_up + me * local * 2 * I * H : nullptr,
                         ddown != nullptr ? ddown + me * local * H * I : nullptr, dy_received.data() + at * H,
                         saved.rows_in + at * H, saved.gate_up_out ? saved.gate_up_out + at * 2 * I : nullptr,
                         saved.act ? saved.act + at * I : nullptr,
                         gate_up + me * local * 2 * I * H, down + me * local * H * I, saved.weight + at,
                         owner_plan(received.expert[c], local), MoeExpertDims{H, I, local, dims.adapter_rank},
                         experts_from(adapters, me * local, H, I), experts_from(adapter_grads, me * local, H, I));
    const int64_t element = sizeof(T);
    counters_.dispatched_bytes += (own.first[c + 1] - own.first[c] - own.sent[c][me]) * H * element;
    counters_.combined_bytes += (R - received.from[c][me]) * (H + 1) * element;
    return group_.start_all_to_all(dx_received.data() + at * H, times(received.from[c], H),
                                   dx_rows.data() + own.first[c] * H, times(own.sent[c], H));
  };
  pipeline(C, start, compute, [&](ProcessGroup::Pending& p) { finish_timed(p); });
  for (int64_t c = 0; c < C; ++c) {
    ProcessGroup::Pending p = group_.start_all_to_all(dweight_received.data() + received.first[c], received.from[c],
                                                      dweight_rows.data() + own.first[c], own.sent[c]);
    finish_timed(p);
  }

  // dweight[t, j] from its row's owner (0 when dropped); dx[t] += its rows' input gradients, j in order.
  parallel_for(N, k * H, [&](int64_t t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = plan.slot_row[t * k + j];
      dweight[t * k + j] = r < 0 ? T(0) : dweight_rows.data()[own.place[r]];
      if (r < 0) continue;
      const T* d = dx_rows.data() + own.place[r] * H;
      for (int64_t c = 0; c < H; ++c) dx[t * H + c] += d[c];
    }
  });
}

void ExpertParallel::forward(float* y, const float* x, const float* gate_up, const float* down, const float* weight,
                             const MoePlan& plan, const MoeExpertDims& dims, const ExpertAdapters<float>& adapters,
                             const ExchangedRowsFor<float>& save) {
  forward_impl(y, x, gate_up, down, weight, plan, dims, adapters, save);
}
void ExpertParallel::forward(double* y, const double* x, const double* gate_up, const double* down,
                             const double* weight, const MoePlan& plan, const MoeExpertDims& dims,
                             const ExpertAdapters<double>& adapters, const ExchangedRowsFor<double>& save) {
  forward_impl(y, x, gate_up, down, weight, plan, dims, adapters, save);
}
void ExpertParallel::backward(float* dx, float* dweight, float* dgate_up, float* ddown, const float* dy,
                              const float* gate_up, const float* down, const float* weight, const MoePlan& plan,
                              const MoeExpertDims& dims, const ExpertAdapters<float>& adapters,
                              const ExpertAdapters<float>& adapter_grads, const ExchangedRows<const float>& saved) {
  backward_impl(dx, dweight, dgate_up, ddown, dy, gate_up, down, weight, plan, dims, adapters, adapter_grads, saved);
}
void ExpertParallel::backward(double* dx, double* dweight, double* dgate_up, double* ddown, const double* dy,
                              const double* gate_up, const double* down, const double* weight, const MoePlan& plan,
                              const MoeExpertDims& dims, const ExpertAdapters<double>& adapters,
                              const ExpertAdapters<double>& adapter_grads, const ExchangedRows<const double>& saved) {
  backward_impl(dx, dweight, dgate_up, ddown, dy, gate_up, down, weight, plan, dims, adapters, adapter_grads, saved);
}

}  // namespace trillion
