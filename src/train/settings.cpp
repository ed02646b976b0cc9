// The training settings' table and what is made from it (see settings.h).
#include "train/settings.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "core/error.h"
#include "model/adapter_layout.h"

namespace trillion {
namespace {

// The groups of a dotted field and its last key: "lr_schedule.peak_lr" → {"lr_schedule"}, "peak_lr".
std::pair<std::vector<std::string>, std::string> split_field(const std::string& field) {
  std::vector<std::string> groups;
  size_t start = 0;
  for (size_t dot = field.find('.'); dot != std::string::npos; dot = field.find('.', start)) {
    groups.push_back(field.substr(start, dot - start));
    start = dot + 1;
  }
  return {groups, field.substr(start)};
}

// Sets the setting's member from a JSON value of trainer_state.json, checking its type and range;
// `where` names the file (and group), `key` the field.
void read_value(const Setting& setting, const nlohmann::json& value, const std::string& where, const std::string& key,
                TrainSettings& settings) {
  const auto bad = [&](const auto&... expected) { fail(where, ": field '", key, "' must be ", expected...); };
  std::visit(
      [&](auto member) {
        using Value = std::remove_reference_t<decltype(settings.*member)>;
        if constexpr (std::is_same_v<Value, int64_t>) {
          if (!value.is_number_integer()) bad("an integer, got ", value.dump());
        } else if constexpr (std::is_same_v<Value, uint64_t>) {
          if (!value.is_number_unsigned()) bad("a non-negative integer, got ", value.dump());
        } else if constexpr (std::is_same_v<Value, double>) {
          if (!value.is_number()) bad("a number, got ", value.dump());
          if (setting.non_negative && !(value.get<double>() >= 0.0)) bad(">= 0, got ", value.get<double>());
        } else if constexpr (std::is_same_v<Value, std::string>) {
          if (!value.is_string()) bad("a string, got ", value.dump());
          const std::string text = value.get<std::string>();
          if (!setting.choices.empty() &&
              std::find(setting.choices.begin(), setting.choices.end(), text) == setting.choices.end())
            bad(one_of(setting.choices), ", got ", text);
        } else {
          if (!value.is_boolean()) bad("true or false, got ", value.dump());
        }
        settings.*member = value.get<Value>();
      },
      setting.member);
}

}  // namespace

const std::vector<Setting>& training_settings() {
  static const std::vector<Setting> table = {
      {"steps", "steps", "Length of the run in optimizer steps (the LR schedule spans it)", &TrainSettings::steps,
       OnResume::may_change},
      {"seed", "seed", "Seed of initialization and data order", &TrainSettings::seed},
      {"dtype", "dtype", "Parameter and compute type", &TrainSettings::dtype, OnResume::must_match,
       {"float32", "float64"}},
      {"precision", "precision",
       "Operands of the matrix products of a float32 run: fp32, or bf16 (rounded to bfloat16, accumulated in "
       "float; the router's stay fp32; master weights, optimizer state and activations stay float32)",
       &TrainSettings::precision, OnResume::must_match, {"fp32", "bf16"}, false, "fp32"},
      {"batch", "batch", "Sequences per micro-batch", &TrainSettings::batch},
      {"seq-len", "seq_len", "Tokens per sequence", &TrainSettings::seq_len},
      {"grad-accum", "grad_accum", "Micro-batches per optimizer step", &TrainSettings::grad_accum},
      {"lr", "lr_schedule.peak_lr", "Peak learning rate", &TrainSettings::lr},
      {"min-lr-ratio", "lr_schedule.min_lr_ratio", "Final learning rate as a fraction of the peak",
       &TrainSettings::min_lr_ratio},
      {"warmup", "lr_schedule.warmup", "Linear warmup steps (default: steps / 20)", &TrainSettings::warmup},
      {"weight-decay", "optimizer.weight_decay", "AdamW decoupled weight decay", &TrainSettings::weight_decay},
      {"beta1", "optimizer.beta1", "AdamW β1", &TrainSettings::beta1},
      {"beta2", "optimizer.beta2", "AdamW β2", &TrainSettings::beta2},
      {"eps", "optimizer.eps", "AdamW ε", &TrainSettings::eps},
      {"clip", "optimizer.clip", "Global gradient-norm clip (≤ 0: off)", &TrainSettings::clip},
      {"moe-bias-rate", "moe_bias_rate",
       "Aux-loss-free balancing of sigmoid routers: after each step b += rate · sign(mean load − load) (0: off)",
       &TrainSettings::moe_bias_rate, OnResume::must_match, {}, true, 0.0},
      {"indexer-mode", "indexer.mode",
       "Sparse attention layers: warmup (dense attention, only the indexers learn), sparse (attention over the "
       "indexer's top-k, all learn), dense (dense attention, all learn)",
       &TrainSettings::indexer_mode, OnResume::may_change, {"dense", "warmup", "sparse"}, false, "sparse"},
      {"indexer-loss-coef", "indexer.loss_coef", "Coefficient of the indexers' KL loss against the main attention (0: off)",
       &TrainSettings::indexer_loss_coef, OnResume::may_change, {}, true, 1.0},
      {"loss-gradients", "loss_gradients",
       "LM-head loss: in-forward (gradients formed chunk by chunk in the forward, 3 GEMM passes) or recompute "
       "(logits recomputed in the backward, 4 passes, least memory)",
       &TrainSettings::loss_gradients, OnResume::must_match, {"in-forward", "recompute"}, false,
       "recompute"},  // states before it recomputed in the backward
      {"document-mask", "document_mask",
       "Packed rows: no token attends across a document end (the tokenizer's eos); positions restart",
       &TrainSettings::document_mask, OnResume::must_match, {}, false, false},
      {"expert-layout", "lora.expert_layout",
       "LoRA: the routed experts' adapters in OUT/adapter as trained, per-expert (one pair per expert module, "
       "transformers 4) or fused (target_parameters on the stacked weights, transformers 5); checkpoints keep "
       "them as trained",
       &TrainSettings::expert_layout, OnResume::may_change, expert_layout_names(), false, "as-trained"},
  };
  return table;
}

nlohmann::json setting_value(const Setting& setting, const TrainSettings& settings) {
  return std::visit([&](auto member) { return nlohmann::json(settings.*member); }, setting.member);
}

std::string setting_text(const Setting& setting, const TrainSettings& settings) {
  const nlohmann::json value = setting_value(setting, settings);
  return value.is_string() ? value.get<std::string>() : value.dump();
}

void write_settings(const TrainSettings& settings, nlohmann::json& json) {
  for (const Setting& setting : training_settings()) {
    const auto [groups, key] = split_field(setting.field);
    nlohmann::json* at = &json;
    for (const std::string& group : groups) at = &(*at)[group];
    (*at)[key] = setting_value(setting, settings);
  }
}

TrainSettings read_settings(const nlohmann::json& json, const std::string& path) {
  TrainSettings settings;
  for (const Setting& setting : training_settings()) {
    const auto [groups, key] = split_field(setting.field);
    const nlohmann::json* at = &json;
    std::string where = path, missing;  // missing: the first absent group, or the key
    for (const std::string& group : groups) {
      if (!at->contains(group)) {
        missing = group;
        break;
      }
      at = &at->at(group);
      where += " " + group;
    }
    if (missing.empty() && !at->contains(key)) missing = key;
    if (missing.empty()) {
      read_value(setting, at->at(key), where, key, settings);
    } else if (!setting.before_it_existed.is_null()) {
      read_value(setting, setting.before_it_existed, where, key, settings);
    } else {
      fail(where, ": missing field '", missing, "'");
    }
  }
  return settings;
}

TrainSettings resumed_settings(const TrainSettings& saved, const TrainSettings& given,
                               const std::set<std::string>& given_flags, const std::string& state_path) {
  TrainSettings settings = saved;
  for (const Setting& setting : training_settings()) {
    if (given_flags.count(setting.flag) == 0) continue;
    if (setting_value(setting, saved) == setting_value(setting, given)) continue;
    const std::string was = setting_text(setting, saved), now = setting_text(setting, given);
    if (setting.on_resume == OnResume::must_match) {
      fail(state_path, ": field '", setting.field, "' is ", was, " but --", setting.flag, " ", now,
           " was given; a resumed run keeps its settings");
    }
    std::fprintf(stderr, "note: --%s %s differs from the resumed run's %s; the run continues with it\n", setting.flag,
                 now.c_str(), was.c_str());
    std::visit([&](auto member) { settings.*member = given.*member; }, setting.member);
  }
  return settings;
}

}  // namespace trillion
