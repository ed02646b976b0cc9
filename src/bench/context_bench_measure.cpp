// The summary over the ranks and the document masks of `trillion bench context-parallel` (see
// bench/context_bench_measure.h).
#include "bench/context_bench_measure.h"

namespace trillion {

// The summary over the ranks: the slowest rank's time per run, the largest error, peak and traffic.
nlohmann::json summarize_ranks(const RankMeasure& m, const ProcessGroup& world) {
  const bool matches = m.plan.forward.gathered_bytes == m.forward.gathered_bytes &&
                       m.plan.forward.reduced_bytes == m.forward.reduced_bytes &&
                       m.plan.backward.gathered_bytes == m.backward.gathered_bytes &&
                       m.plan.backward.reduced_bytes == m.backward.reduced_bytes;
  std::vector<double> mine = {m.err, double(m.peak), double(m.forward.total()), double(m.backward.total()),
                              matches ? 1.0 : 0.0};
  mine.insert(mine.end(), m.seconds.begin(), m.seconds.end());
  const std::vector<double> all = world.all_gather_values<double>(mine);  // [ranks, mine.size()]
  const size_t n = mine.size();
  double err = 0.0, peak = 0.0, forward = 0.0, backward = 0.0;
  bool all_match = true;
  std::vector<double> slowest(m.seconds.size(), 0.0);
  for (int r = 0; r < world.size(); ++r) {
    const double* at = all.data() + r * n;
    err = std::max(err, at[0]);
    peak = std::max(peak, at[1]);
    forward = std::max(forward, at[2]);
    backward = std::max(backward, at[3]);
    all_match = all_match && at[4] == 1.0;
    for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], at[5 + i]);
  }
  const TimingResult timing = summarize(slowest);
  nlohmann::json plain;  // on one rank: the plain kernels, and what the split path costs more
  if (!m.one_rank_seconds.empty()) {
    const double one_rank_s = summarize(m.one_rank_seconds).median_s;
    plain = {{"one_rank_s", one_rank_s}, {"split_overhead", timing.median_s / one_rank_s}};
  }
  return {{"cp", world.size()},
          {"plain", plain},
          {"median_s", timing.median_s},
          {"min_s", timing.min_s},
          {"runs", timing.runs},
          {"max_rel_err", err},
          {"peak_bytes", int64_t(peak)},
          {"one_rank_peak_bytes", m.one_rank_peak},
          {"peak_ratio", peak / double(m.one_rank_peak)},
          {"forward_received_bytes", int64_t(forward)},
          {"backward_received_bytes", int64_t(backward)},
          {"traffic_matches_plan", all_match}};
}

// Documents start where (position + 7 · row) is a multiple of doc_len, so they cross chunks:
// [batch, seq] each token's document start.
std::vector<int32_t> document_starts(int64_t batch, int64_t seq, int64_t doc_len) {
  std::vector<int32_t> doc_start(batch * seq, 0);
  for (int64_t b = 0; b < batch && doc_len > 0; ++b)
    for (int64_t t = 0; t < seq; ++t) doc_start[b * seq + t] = int32_t(std::max<int64_t>(0, t - (t + 7 * b) % doc_len));
  return doc_start;
}

// The documents as packed segments over the batch · seq tokens, [segments + 1] (empty: no masks).
std::vector<int32_t> document_segments(const std::vector<int32_t>& doc_start, int64_t seq) {
  std::vector<int32_t> cu_seqlens;
  for (int64_t t = 0; t < int64_t(doc_start.size()); ++t)
    if (doc_start[t] == t % seq) cu_seqlens.push_back(int32_t(t));
  cu_seqlens.push_back(int32_t(doc_start.size()));
  return cu_seqlens;
}

}  // namespace trillion
