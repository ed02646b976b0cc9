// `trillion bench moe-parallel` (under mpirun): training steps of a MoE config with FSDP over the
// world and the routed experts over --ep groups, the expert exchange in one chunk (every
// all-to-all waited for at once: nothing overlaps) and pipelined over --chunks token chunks
// (parallel/expert_parallel.h), alternating rounds of both in one run.
//
// Reports per mode the mean step time (the slowest rank's), the time the ranks spent waiting for
// exchanges to complete (mean over ranks, per step), the first step's loss (both modes must agree:
// the same weights and batch), and the fraction of the serial mode's exchange wait that the
// pipeline hides: 1 − wait(pipelined) / wait(serial). On one shared-memory machine a transfer
// progresses only inside MPI calls, so little can hide there; the number is reported, not a target.
// Forward and backward only (no optimizer step: every round starts from the same weights).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trillion {

struct MoeParallelBenchOptions {
  std::string config;  // model config.json with MoE layers
  int64_t batch = 8;   // global sequences per step (split over the ranks)
  int64_t seq_len = 128;
  int steps = 5;    // timed steps per round
  int rounds = 2;   // alternating rounds of each mode
  int warmup = 1;   // untimed steps per round
  int ep = 2;       // expert-parallel degree (divides the ranks)
  int chunks = 4;   // token chunks of the pipelined mode
  uint64_t seed = 1;
};

// Every rank calls it; the summary is complete on rank 0.
nlohmann::json run_moe_parallel_bench(const MoeParallelBenchOptions& options);

}  // namespace trillion
