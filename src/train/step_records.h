// The metrics records of a training step that come from its parallel and memory machinery: what
// the activation store did ("memory"), what FSDP moved and held on every rank ("fsdp"), and what
// the expert exchange sent with every rank's routing loads ("expert_parallel"), and what every rank
// of a context-parallel group received ("context_parallel"). The parallel ones
// are collectives: every rank calls them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "memory/activation_store.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/process_group.h"
#include "train/moe_balance.h"

namespace trillion {

nlohmann::json memory_record(const StoreCounters& before, const StoreCounters& after);

template <class T>
nlohmann::json fsdp_record(const ProcessGroup& world, const Fsdp<T>& fsdp, const FsdpCounters& before,
                           int64_t peak_bytes, int64_t planned_peak_bytes);

nlohmann::json expert_parallel_record(const ProcessGroup& world, int ep, const ExpertParallelCounters& now,
                                      const ExpertParallelCounters& before, const StepStats& stats);

nlohmann::json context_parallel_record(const ProcessGroup& world, int cp, const ContextTraffic& now,
                                       const ContextTraffic& before);

}  // namespace trillion
