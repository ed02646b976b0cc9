// `trillion train`: the training loop (docs/architecture.md, "Commands and their outputs").
//
// Per optimizer step: draw grad_accum micro-batches of [batch, seq_len] windows from the sampler,
// count the non-ignored targets of the whole step, run forward_backward on each micro-batch with
// loss_scale = 1 / count (the loss is normalized over the whole step), compute the global gradient
// norm, clip, apply AdamW with the scheduled learning rate (weight decay where the parameter table
// says), zero the gradients, append a metrics.jsonl line, and checkpoint when due.
// A run starts fresh (seeded init), from weights (--init: a new run) or resumes (--resume: weights,
// optimizer, step, schedule and data position, so the continued run is bitwise identical to an
// uninterrupted one). A SIGTERM or SIGINT ends the run after its current step with a checkpoint
// (train/stop_signals.h).
//
// MFU (metrics field `mfu`, float32 runs only): model FLOPs per second (training_flops_per_token ×
// tokens/s, the active FLOPs for MoE) as a fraction of the ceiling `trillion bench gemm` reports,
// the float32 sgemm rate of a 2048³ product at the process's thread count (SgemmProblem, median of
// 5 runs after a warm-up; --mfu-gemm-size changes the size, e.g. for quick tests), timed at start-up.
// A start-up on a busy machine under-measures the ceiling, so the first step whose MFU comes out
// above 1 measures it once more and keeps the larger rate; any MFU still above 1 is printed
// "(ceiling stale)" and that step's metrics get "mfu_ceiling_stale": true. `mfu_peak` ("peak" in the
// progress line) is the same against the physical peak of the run's precision (bench/physical_peak.h),
// also measured at start-up. float64 runs have no such ceiling and write neither.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "memory/activation_store.h"
#include "train/checkpoint.h"

namespace trillion {

struct TrainOptions {
  std::string config_path;  // model config.json (optional on --resume / --init: taken from there)
  std::string data_dir;     // DIR or a mixture DIR:W,… (data/mixture.h); optional on --resume: from trainer_state.json
  std::string out_dir;      // optional on --resume: the resumed run's output directory
  std::string resume_dir;   // OUT dir (uses OUT/latest) or checkpoint dir
  std::string init_dir;     // weights to start a new run from
  TrainSettings settings;
  std::set<std::string> given;  // names of the TrainSettings flags set on the command line
  int64_t stop_after = 0;       // > 0: end this process after that step, with a checkpoint
  int64_t save_every = 0;       // > 0: checkpoint every that many steps
  int64_t keep_last = 0;        // > 0: keep only the newest that many checkpoints (train/checkpoint.h)
  int64_t eval_every = 0;       // > 0: validation loss every that many steps
  int64_t eval_batches = 8;     // batches of `batch` windows per evaluation
  int64_t log_every = 1;        // progress line every that many steps
  int64_t mfu_gemm_size = 2048;  // size of the sgemm that sets the MFU ceiling (see above)
  // Numeric guards (train/numeric_guard.h): what a non-finite step does, how many may be skipped in
  // a row, and whether each forward names its first non-finite sublayer output.
  std::string on_nonfinite = "stop";
  int64_t max_nonfinite_skips = 10;
  bool check_numerics = false;
  // Memory policy of the saved activations (memory/save_policies.h); results are bitwise the same
  // under every policy, so these are settings of the process, not of the run.
  std::string recompute = "none";
  std::string swap = "none";
  std::string swap_dir;  // where the swap file goes (default: the output directory)
  bool swap_bf16 = false;  // swapped float32 tensors stored as bfloat16 (lossy)
  int64_t policy_min_bytes = ActivationStore::kPagedMinBytes;  // smaller saved tensors are always kept
  // The fast tier's budget ("2G"; empty: none): the cheapest policy whose planned peak fits is
  // taken (train/memory_plan.h), or the run stops before training naming the smallest it could meet.
  std::string memory_budget;
  double collective_timeout_s = 600.0;  // under mpirun: how long a collective may wait (ProcessGroup)
  int ep = 1;  // expert-parallel degree: the routed experts split over groups of ep ranks
  int ep_chunks = 1;  // token chunks of the expert exchange (> 1: communication overlaps compute)
  int cp = 1;  // context-parallel degree: each sequence split over groups of cp ranks (parallel/context_parallel.h)
  // With --ep, the memory plan's routing imbalance: the rows a rank's experts receive per MoE layer
  // as a multiple of the rank's own routed rows (1: every rank's experts get the mean).
  double expert_imbalance = 1.25;
  bool sharded_checkpoints = false;  // under mpirun: each rank writes its shard (train/sharded_checkpoint.h)
  bool dry_run = false;  // print the memory plan (stdout: JSON; stderr: lines) and train nothing
                         // (needs --config; --data adds the sampler's share)
  // LoRA: an adapter trained on the frozen base. A resumed run keeps its checkpoint's adapter. The
  // run writes OUT/adapter/ and each checkpoint's adapter/ in PEFT's files.
  LoraOptions lora;
};

// Runs (or resumes) a training run; throws trillion::Error on bad input. With dry_run, prints the
// memory plan of the run's step instead (only --config and the step's settings are needed).
void run_training(TrainOptions options);

}  // namespace trillion
