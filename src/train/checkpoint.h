// Training checkpoints and the state that makes a run resumable.
//
// A checkpoint is a directory OUT/checkpoint-<step, 6 digits>/ holding
//   model.safetensors (or shards + index)  model weights, Hugging Face layout (Model::save_weights)
//   config.json                            the model config
//   optimizer.safetensors                  AdamW moments per parameter (Optimizer::save)
//   trainer_state.json                     TrainerState: step, data position, schedule, settings
//   adapter/                               a LoRA run's adapter in PEFT's files (Model::save_adapter)
// or, written with --sharded-checkpoints under mpirun, shards/ (each rank's slice of the parameters
// and moments, and an index: train/sharded_checkpoint.h) in place of the weights and optimizer files.
// It is written into a temporary directory and renamed into place, then OUT/latest (a one-line
// file naming the newest checkpoint directory) is replaced atomically, so an interruption at any
// moment leaves the previous checkpoint intact and `latest` pointing at a complete one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "train/settings.h"

namespace trillion {

struct TrainerState {
  TrainSettings settings;
  int64_t step = 0;              // optimizer steps completed
  int64_t sampler_position = 0;  // windows handed out by the training sampler
  std::vector<int64_t> source_positions;  // a --data mixture's positions per directory (else empty)
  uint64_t tokenizer_hash = 0;
  uint64_t train_checksum = 0;  // of the train split(s) (DataMixture): a resumed run must read the same tokens
  std::string data_dir;         // the --data spec, directories absolute (data/mixture.h)
  int64_t tokens_seen = 0;
  double elapsed_s = 0.0;
  int64_t nonfinite_skips = 0;  // steps dropped as non-finite (--on-nonfinite skip) so far

  nlohmann::json to_json() const;
  // Parses OUT/checkpoint-*/trainer_state.json; errors name the file and the field.
  static TrainerState load(const std::string& path);
};

// 16 lowercase hex digits: how trainer_state.json stores 64-bit hashes (JSON numbers lose bits
// above 2^53 in many readers).
std::string hex64(uint64_t value);

// "checkpoint-000020"
std::string checkpoint_name(int64_t step);

// A `--resume`/`--init`/`--checkpoint` argument: a training output directory (uses DIR/latest) or
// a checkpoint directory (has trainer_state.json). Throws trillion::Error otherwise.
std::string resolve_checkpoint_dir(const std::string& directory);

// Like resolve_checkpoint_dir, but also accepts a plain weights directory (config.json +
// model.safetensors) without trainer state, as `--init` does for Hugging Face checkpoints.
std::string resolve_weights_dir(const std::string& directory);

// The LoRA adapter that goes with the weights in `weights_dir`: `given` (an --adapter DIR), else
// the checkpoint's own adapter/ (a LoRA run's), else none (empty). With one, config.lora is set
// from its adapter_config.json; load it with Model::load_adapter after the weights.
std::string attach_adapter(ModelConfig& config, const std::string& weights_dir, const std::string& given);

// Creates OUT/checkpoint-<step>/ atomically: `write_contents(temp_dir)` writes the files into a
// temporary directory, which is then renamed into place (or, when a checkpoint of that step already
// exists, exchanged with it by one renameat2(RENAME_EXCHANGE), the old one removed afterwards);
// OUT/latest is updated last. The directory's creation, rename and exchange go through the
// file-output interface (io/file_output.h) like every file; on a failure the temporary directory is
// removed and the error names the path. Returns the checkpoint directory.
std::string write_checkpoint(const std::string& out_dir, int64_t step,
                             const std::function<void(const std::string& temp_dir)>& write_contents);

// After checkpoint `newest_step` is complete (written, and named by OUT/latest): removes the
// checkpoints of earlier steps beyond the newest keep_last (counting newest_step's; keep_last 0
// keeps all), and leftovers of interrupted writes and removals (hidden ".checkpoint-…" entries).
// Each doomed checkpoint is first renamed to a hidden name (through the file-output interface,
// then a directory sync), so a removal cut short never leaves a partial checkpoint under its name.
void prune_checkpoints(const std::string& out_dir, int64_t newest_step, int64_t keep_last);

}  // namespace trillion
