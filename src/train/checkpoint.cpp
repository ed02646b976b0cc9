// Trainer state serialization, checkpoint directory resolution and atomic checkpoint writing
// (see checkpoint.h).
#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_output.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

const nlohmann::json& field(const nlohmann::json& json, const char* key, const std::string& path) {
  if (!json.contains(key)) fail(path, ": missing field '", key, "'");
  return json.at(key);
}

int64_t int_field(const nlohmann::json& json, const char* key, const std::string& path) {
  const nlohmann::json& value = field(json, key, path);
  if (!value.is_number_integer()) fail(path, ": field '", key, "' must be an integer, got ", value.dump());
  return value.get<int64_t>();
}

double number_field(const nlohmann::json& json, const char* key, const std::string& path) {
  const nlohmann::json& value = field(json, key, path);
  if (!value.is_number()) fail(path, ": field '", key, "' must be a number, got ", value.dump());
  return value.get<double>();
}

std::string string_field(const nlohmann::json& json, const char* key, const std::string& path) {
  const nlohmann::json& value = field(json, key, path);
  if (!value.is_string()) fail(path, ": field '", key, "' must be a string, got ", value.dump());
  return value.get<std::string>();
}

uint64_t hex64_field(const nlohmann::json& json, const char* key, const std::string& path) {
  const std::string text = string_field(json, key, path);
  char* end = nullptr;
  const uint64_t value = std::strtoull(text.c_str(), &end, 16);
  if (text.size() != 16 || *end != '\0') fail(path, ": field '", key, "' must be 16 hex digits, got \"", text, "\"");
  return value;
}

}  // namespace

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, value);
  return text;
}

nlohmann::json TrainerState::to_json() const {
  nlohmann::json json = {
      {"format", "trillion-trainer-state-1"},
      {"step", step},
      {"sampler_position", sampler_position},
      {"tokens_seen", tokens_seen},
      {"elapsed_s", elapsed_s},
      {"tokenizer_hash", hex64(tokenizer_hash)},
      {"train_checksum", hex64(train_checksum)},
      {"data_dir", data_dir},
      {"lr_schedule", {{"kind", "warmup_cosine"}, {"total_steps", settings.steps}}},
      {"optimizer", {{"kind", "adamw"}}},
  };
  write_settings(settings, json);  // train/settings.h: each at its field
  if (!source_positions.empty()) json["source_positions"] = source_positions;
  if (nonfinite_skips > 0) json["nonfinite_skips"] = nonfinite_skips;
  return json;
}

TrainerState TrainerState::load(const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  if (!json.is_object()) fail(path, ": expected a JSON object");
  TrainerState state;
  state.step = int_field(json, "step", path);
  state.settings = read_settings(json, path);
  const TrainSettings& s = state.settings;
  state.sampler_position = int_field(json, "sampler_position", path);
  state.tokens_seen = int_field(json, "tokens_seen", path);
  state.elapsed_s = number_field(json, "elapsed_s", path);
  state.tokenizer_hash = hex64_field(json, "tokenizer_hash", path);
  state.train_checksum = hex64_field(json, "train_checksum", path);
  state.data_dir = string_field(json, "data_dir", path);
  if (state.sampler_position < 0) {
    fail(path, ": field 'sampler_position' must be >= 0, got ", state.sampler_position);
  }
  if (json.contains("source_positions")) {  // mixtures only
    const nlohmann::json& positions = field(json, "source_positions", path);
    if (!positions.is_array()) fail(path, ": field 'source_positions' must be an array of integers");
    int64_t sum = 0;
    for (const nlohmann::json& p : positions) {
      if (!p.is_number_integer() || p.get<int64_t>() < 0)
        fail(path, ": field 'source_positions' must hold integers >= 0, got ", p.dump());
      state.source_positions.push_back(p.get<int64_t>());
      sum += state.source_positions.back();
    }
    if (sum != state.sampler_position)
      fail(path, ": field 'source_positions' sums to ", sum, ", not 'sampler_position' ", state.sampler_position);
  }
  if (json.contains("nonfinite_skips")) {  // only runs that skipped a step
    state.nonfinite_skips = int_field(json, "nonfinite_skips", path);
    if (state.nonfinite_skips < 0 || state.nonfinite_skips > state.step)
      fail(path, ": field 'nonfinite_skips' must be in [0, step=", state.step, "], got ", state.nonfinite_skips);
  }
  if (state.tokens_seen < 0) fail(path, ": field 'tokens_seen' must be >= 0, got ", state.tokens_seen);
  if (state.step < 0 || state.step > s.steps) fail(path, ": field 'step' must be in [0, steps=", s.steps, "], got ", state.step);
  return state;
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "checkpoint-%06" PRId64, step);
  return name;
}

std::string resolve_checkpoint_dir(const std::string& directory) {
  if (!fs::is_directory(directory)) fail(directory, ": no such directory (expected a training output or checkpoint directory)");
  const fs::path latest = fs::path(directory) / "latest";
  if (fs::exists(latest)) {
    std::string name = read_file(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    const fs::path checkpoint = fs::path(directory) / name;
    if (name.empty() || !fs::exists(checkpoint / "trainer_state.json")) {
      fail(latest.string(), ": names \"", name, "\", which is not a checkpoint directory with trainer_state.json");
    }
    return checkpoint.string();
  }
  if (fs::exists(fs::path(directory) / "trainer_state.json")) return directory;
  fail(directory, ": not a training output directory (no 'latest' file) nor a checkpoint (no 'trainer_state.json')");
}

std::string resolve_weights_dir(const std::string& directory) {
  if (fs::is_directory(directory) && !fs::exists(fs::path(directory) / "latest") &&
      fs::exists(fs::path(directory) / "config.json")) {
    return directory;
  }
  return resolve_checkpoint_dir(directory);
}

std::string attach_adapter(ModelConfig& config, const std::string& weights_dir, const std::string& given) {
  const fs::path own = fs::path(weights_dir) / "adapter";
  const std::string adapter = !given.empty() ? given : fs::exists(own / "adapter_config.json") ? own.string() : "";
  if (!adapter.empty())
    config.lora = std::make_shared<const LoraConfig>(LoraConfig::load((fs::path(adapter) / "adapter_config.json").string()));
  return adapter;
}

std::string write_checkpoint(const std::string& out_dir, int64_t step,
                             const std::function<void(const std::string& temp_dir)>& write_contents) {
  const std::string name = checkpoint_name(step);
  const fs::path final_dir = fs::path(out_dir) / name;
  const fs::path temp_dir = fs::path(out_dir) / ("." + name + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(temp_dir);  // a leftover of an interrupted run of this process id
  FileOutput& output = file_output();
  if (const int error = output.make_directory(temp_dir.string()))
    fail(temp_dir.string(), ": cannot create the checkpoint directory: ", std::strerror(error));
  try {
    write_contents(temp_dir.string());
    sync_directory(temp_dir.string());
  } catch (...) {
    fs::remove_all(temp_dir);  // nothing half-written stays behind; the previous checkpoint is untouched
    throw;
  }
  // A checkpoint of the same step from an earlier run (a run resumed from an older checkpoint) is
  // swapped with the new one in one atomic exchange (renameat2 RENAME_EXCHANGE), so `latest` never
  // names a missing directory; the old contents, now under the temporary name, are removed before
  // `latest` is written, so a failure there leaves nothing behind.
  const bool replaced = fs::exists(final_dir);
  const int error = replaced ? output.exchange(temp_dir.string(), final_dir.string())
                             : output.rename_file(temp_dir.string(), final_dir.string());
  if (error != 0) {
    fs::remove_all(temp_dir);
    fail(final_dir.string(), replaced ? ": cannot exchange it with the new checkpoint " : ": cannot rename ",
         temp_dir.string(), replaced ? ": " : " to it: ", std::strerror(error));
  }
  sync_directory(out_dir);
  if (replaced) fs::remove_all(temp_dir);  // the old contents: the name they had holds the new ones
  write_file_atomic((fs::path(out_dir) / "latest").string(), name + "\n");
  return final_dir.string();
}

void prune_checkpoints(const std::string& out_dir, int64_t newest_step, int64_t keep_last) {
  std::vector<int64_t> older;  // steps of complete checkpoints before newest_step
  std::vector<fs::path> doomed;
  for (const fs::directory_entry& entry : fs::directory_iterator(out_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".checkpoint-", 0) == 0) doomed.push_back(entry.path());
    int64_t step = 0;
    if (std::sscanf(name.c_str(), "checkpoint-%" SCNd64, &step) == 1 && name == checkpoint_name(step) &&
        step < newest_step)
      older.push_back(step);
  }
  std::sort(older.begin(), older.end());
  const int64_t removed = keep_last > 0 ? std::max<int64_t>(0, int64_t(older.size()) - (keep_last - 1)) : 0;
  FileOutput& output = file_output();
  for (int64_t i = 0; i < removed; ++i) {
    const fs::path dir = fs::path(out_dir) / checkpoint_name(older[i]);
    const fs::path aside = fs::path(out_dir) / str_cat(".", checkpoint_name(older[i]), ".removing");
    fs::remove_all(aside);
    if (const int error = output.rename_file(dir.string(), aside.string()))
      fail(dir.string(), ": cannot move it aside to remove it (--keep-last ", keep_last, "): ", std::strerror(error));
    doomed.push_back(aside);
  }
  if (removed > 0) sync_directory(out_dir);  // the checkpoints are gone by name before their files go
  for (const fs::path& path : doomed) fs::remove_all(path);
}

}  // namespace trillion
