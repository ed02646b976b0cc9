// The settings of a training run, declared once. TrainSettings holds them; the table
// training_settings() gives each one's flag, its field in trainer_state.json, its help text, its
// allowed values, what a resumed run does when it is given again, and the value states written
// before it existed imply. The command line's flags (cli/train.cpp), trainer_state.json's reader
// and writer (train/checkpoint.cpp) and the resume checks (train/run_setup.cpp) all come from it, so
// a new setting is one member and one row.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace trillion {

// Everything that defines the sequence of optimizer steps of a run (a resumed run must agree).
struct TrainSettings {
  int64_t steps = 100;  // the run's length; the LR schedule spans it
  uint64_t seed = 1234;
  std::string dtype = "float32";  // "float32" | "float64"
  std::string precision = "fp32";  // float32 runs' matmul operands: "fp32" | "bf16" (ops/gemm.h MatmulPrecision)
  int64_t batch = 8;              // sequences per micro-batch
  int64_t seq_len = 256;
  int64_t grad_accum = 1;         // micro-batches per optimizer step
  double lr = 3e-3;               // peak learning rate
  double min_lr_ratio = 0.1;
  int64_t warmup = 0;             // warmup steps
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip = 1.0;  // global grad-norm clip; ≤ 0 disables
  double moe_bias_rate = 0.0;  // aux-loss-free balancing: b += rate · sign(mean load − load); 0 = off
  std::string indexer_mode = "sparse";  // sparse attention layers: "dense" | "warmup" | "sparse" (IndexerMode)
  double indexer_loss_coef = 1.0;       // their indexers' KL loss (0: off)
  std::string loss_gradients = "in-forward";  // LM-head loss: "in-forward" | "recompute" (LossGradients)
  bool document_mask = false;  // packed rows: no attention across the data's eos (Model::set_document_mask)
  std::string expert_layout = "as-trained";  // LoRA: OUT/adapter's routed experts' pairs (model/adapter_layout.h)
};

// What a resumed run does with a setting given again on its command line.
enum class OnResume {
  must_match,  // the saved value stays; a different one given is an error naming both
  may_change,  // the given value is taken (the indexer's stage; --steps, with a note)
};

using SettingMember = std::variant<int64_t TrainSettings::*, uint64_t TrainSettings::*, double TrainSettings::*,
                                   std::string TrainSettings::*, bool TrainSettings::*>;

struct Setting {
  const char* flag;   // "seq-len": the command line's --seq-len
  const char* field;  // "seq_len", or a dotted path into trainer_state.json: "lr_schedule.peak_lr"
  const char* help;
  SettingMember member;
  OnResume on_resume = OnResume::must_match;
  std::vector<std::string> choices = {};  // a string's allowed values (empty: any)
  bool non_negative = false;              // a number's
  // States written before the setting existed lack its field (or its group): they mean this value
  // (null: the field is required).
  nlohmann::json before_it_existed = nullptr;
};

// Every setting, in the command line's order.
const std::vector<Setting>& training_settings();

// The setting's value in `settings` as JSON (trainer_state.json's), and as text (messages: a
// string without quotes).
nlohmann::json setting_value(const Setting& setting, const TrainSettings& settings);
std::string setting_text(const Setting& setting, const TrainSettings& settings);

// Writes every setting at its field of `json` (groups made as needed).
void write_settings(const TrainSettings& settings, nlohmann::json& json);
// Reads every setting from trainer_state.json's `json`; errors name `path`, the group and the
// field and what it must be.
TrainSettings read_settings(const nlohmann::json& json, const std::string& path);

// A resumed run's settings: the saved ones, with the may-change settings of `given_flags` taken
// from `given`; a must-match setting given with another value fails naming `state_path`, the
// field, both values and the flag.
TrainSettings resumed_settings(const TrainSettings& saved, const TrainSettings& given,
                               const std::set<std::string>& given_flags, const std::string& state_path);

}  // namespace trillion
