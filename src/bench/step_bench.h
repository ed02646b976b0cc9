// `trillion bench step`: whole training steps of a model config (forward, backward, gradient
// clipping and AdamW, float32) after warm-up, on random tokens, with where each step's time goes.
//
// Reports the median step time and tokens/s; MFU = training FLOPs per token (the trainer's formula,
// Model::training_flops_per_token: 6 · active parameters per token plus attention's 12 · (seq / 2)
// · Hq · head_dim per layer, the LM head counted) × tokens/s over the sgemm rate measured in the
// same process, one sgemm run after each timed step (median), so the ceiling sees the steps' load
// on a shared machine (under --precision bf16 the same float product with bf16 operands, the rate
// at that precision); and the phase clock's breakdown (core/phase_clock.h): per phase (gemm, attention,
// moe, elementwise, loss, optimizer, other) and idle, the team's thread-seconds per step divided by
// the thread count, so they add up to the step's wall time (`coverage`: their sum over the step
// time measured around it).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trillion {

struct StepBenchOptions {
  std::string config;       // model config.json
  int64_t batch = 16;
  int64_t seq_len = 128;
  int steps = 10;           // timed steps (median reported; fewer than 10 is for smoke tests only)
  int warmup = 2;           // untimed steps first
  uint64_t seed = 1;        // weights and tokens
  int64_t gemm_size = 2048; // size of the sgemm that sets the MFU ceiling
  std::string precision = "fp32";  // the products' operands (ops/gemm.h MatmulPrecision), ceiling included
};

// Runs the benchmark and returns its summary (one JSON object).
nlohmann::json run_step_bench(const StepBenchOptions& options);

}  // namespace trillion
