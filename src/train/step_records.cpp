// The metrics records of a training step (see step_records.h).
#include "train/step_records.h"

#include <vector>

#include "core/memory.h"

namespace trillion {
namespace {

// Column `column` of a [ranks, width] table gathered from every rank.
std::vector<int64_t> column_of(const std::vector<int64_t>& table, int64_t width, int64_t column) {
  std::vector<int64_t> out;
  for (size_t at = column; at < table.size(); at += width) out.push_back(table[at]);
  return out;
}

}  // namespace

// What the activation store did in one step (metrics field "memory"): bytes saved, dropped for and
// refilled by recompute, written to and read back from the swap file, the main thread's wait on
// swap I/O, and the slow tier's peak.
nlohmann::json memory_record(const StoreCounters& before, const StoreCounters& after) {
  return {{"saved_bytes", after.saved_bytes - before.saved_bytes},
          {"recompute_dropped_bytes", after.dropped_bytes - before.dropped_bytes},
          {"recomputed_bytes", after.recomputed_bytes - before.recomputed_bytes},
          {"swapped_out_bytes", after.swapped_out_bytes - before.swapped_out_bytes},
          {"swap_read_bytes", after.read_back_bytes - before.read_back_bytes},
          {"swap_wait_s", after.swap_wait_seconds - before.swap_wait_seconds},
          {"peak_slow_bytes", MemoryStats::peak(Tier::slow)}};
}

// Metrics field "fsdp": this step's bytes moved by the gathers and reduce-scatters and the peak of
// gathered parameters on this rank; the shard's resident state (parameters, gradients and both
// moments), its frozen shard's elements (LoRA's base) and the elements it gathers to use; and every rank's peak fast-tier and resident bytes
// and its planned peak (a collective: all ranks call it).
template <class T>
nlohmann::json fsdp_record(const ProcessGroup& world, const Fsdp<T>& fsdp, const FsdpCounters& before,
                           int64_t peak_bytes, int64_t planned_peak_bytes) {
  const FsdpCounters& now = fsdp.counters();
  const std::vector<int64_t> memory =
      world.all_gather_values<int64_t>({peak_bytes, peak_rss_bytes(), planned_peak_bytes});  // [ranks, 3]
  return {{"ranks", world.size()},
          {"gathered_bytes", now.gathered_bytes - before.gathered_bytes},
          {"reduce_scattered_bytes", now.reduce_scattered_bytes - before.reduce_scattered_bytes},
          {"peak_gathered_bytes", now.peak_gathered_bytes},
          {"shard_elements", fsdp.shard_size()},
          {"held_elements", fsdp.held_elements()},
          {"shard_state_bytes", 4 * fsdp.shard_size() * static_cast<int64_t>(sizeof(T))},
          {"frozen_shard_elements", fsdp.frozen_shard_size()},
          {"rank_peak_bytes", column_of(memory, 3, 0)},
          {"rank_peak_rss_bytes", column_of(memory, 3, 1)},
          {"rank_planned_peak_bytes", column_of(memory, 3, 2)}};
}

// Metrics field "expert_parallel": every rank's bytes of this step's dispatches (rows sent to other
// ranks' experts, forward and backward) and combines (rows sent back), and every rank's own routing
// loads per MoE layer ("rank_tokens_per_expert": [layers][ranks][E]), from which the bytes follow;
// a collective.
nlohmann::json expert_parallel_record(const ProcessGroup& world, int ep, const ExpertParallelCounters& now,
                                      const ExpertParallelCounters& before, const StepStats& stats) {
  // One gather per step: [dispatched, combined, every layer's loads] of each rank.
  std::vector<int64_t> mine = {now.dispatched_bytes - before.dispatched_bytes, now.combined_bytes - before.combined_bytes};
  for (const MoeLayerStats& layer : stats.layers())
    mine.insert(mine.end(), layer.rank_tokens_per_expert.begin(), layer.rank_tokens_per_expert.end());
  const int64_t width = static_cast<int64_t>(mine.size());
  const std::vector<int64_t> all = world.all_gather_values(mine);  // [ranks, width]
  nlohmann::json loads = nlohmann::json::array();
  int64_t at = 2;
  for (const MoeLayerStats& layer : stats.layers()) {
    const int64_t E = static_cast<int64_t>(layer.rank_tokens_per_expert.size());
    nlohmann::json per_rank = nlohmann::json::array();
    for (int r = 0; r < world.size(); ++r) {
      per_rank.push_back(std::vector<int64_t>(all.begin() + r * width + at, all.begin() + r * width + at + E));
    }
    loads.push_back(per_rank);
    at += E;
  }
  return {{"ep", ep},
          {"rank_dispatched_bytes", column_of(all, width, 0)},
          {"rank_combined_bytes", column_of(all, width, 1)},
          {"rank_tokens_per_expert", loads}};
}

// Metrics field "context_parallel": every rank's bytes received in this step from the other ranks of
// its group: the rows it gathered (keys, values, latents, halos, state summaries) and the partial
// sums of its own rows (parallel/context_parallel.h); a collective.
nlohmann::json context_parallel_record(const ProcessGroup& world, int cp, const ContextTraffic& now,
                                       const ContextTraffic& before) {
  const std::vector<int64_t> all = world.all_gather_values<int64_t>(
      {now.gathered_bytes - before.gathered_bytes, now.reduced_bytes - before.reduced_bytes});  // [ranks, 2]
  return {{"cp", cp}, {"rank_gathered_bytes", column_of(all, 2, 0)}, {"rank_reduced_bytes", column_of(all, 2, 1)}};
}

template nlohmann::json fsdp_record<float>(const ProcessGroup&, const Fsdp<float>&, const FsdpCounters&, int64_t,
                                           int64_t);
template nlohmann::json fsdp_record<double>(const ProcessGroup&, const Fsdp<double>&, const FsdpCounters&, int64_t,
                                            int64_t);

}  // namespace trillion
