// `trillion export --checkpoint DIR --out OUT`: a training checkpoint, gathered or sharded
// (train/sharded_checkpoint.h), as a Hugging Face model directory: config.json and the weights in
// the layout transformers loads (model.safetensors, or shards and an index), in float32 or, with
// `--dtype bfloat16`, rounded to bfloat16 (half the bytes, what Hugging Face users of bf16 models
// load; config.json's torch_dtype says which). The checkpoint keeps its float32 master weights. DIR
// is a training output directory (its latest checkpoint) or one checkpoint. Run it as one process.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/sharded_checkpoint.h"

namespace trillion {
namespace {
namespace fs = std::filesystem;

struct ExportOptions {
  std::string checkpoint;
  std::string out;
  std::string dtype = "float32";  // "float32" | "bfloat16"
};

void run_export(const ExportOptions& o) {
  const std::string dir = resolve_checkpoint_dir(o.checkpoint);
  if (fs::exists(fs::path(o.out) / "config.json"))
    fail(o.out, ": already holds a model (config.json); expected a new or empty directory");
  const ModelConfig config = ModelConfig::load((fs::path(dir) / "config.json").string());
  Model<float> model(config);
  if (is_sharded_checkpoint(dir)) {
    read_sharded_checkpoint<float>(dir, model.table(), model.params(), nullptr, nullptr);
  } else {
    model.load_weights(dir);
  }
  fs::create_directories(o.out);
  model.save_weights(o.out, /*bfloat16=*/o.dtype == "bfloat16");
  nlohmann::json hf_config = config.to_json();
  hf_config["torch_dtype"] = o.dtype;
  write_file_atomic((fs::path(o.out) / "config.json").string(), hf_config.dump(2) + "\n");
  std::printf("exported %s to %s (%s, %s)\n", dir.c_str(), o.out.c_str(),
              is_sharded_checkpoint(dir) ? "from its shards" : "as saved", o.dtype.c_str());
}

}  // namespace

void register_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd = app.add_subcommand("export", "Write a training checkpoint (gathered or sharded) as a Hugging Face model");
  cmd->add_option("--checkpoint", o->checkpoint, "Training output directory or checkpoint directory")->required();
  cmd->add_option("--out", o->out, "Directory of the Hugging Face model (config.json, safetensors)")->required();
  cmd->add_option("--dtype", o->dtype, "Stored type of the weights: float32 or bfloat16 (rounded to nearest even)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  cmd->callback([o] { run_export(*o); });
}

}  // namespace trillion
