// `trillion export --checkpoint DIR --out OUT`: a training checkpoint, gathered or sharded
// (train/sharded_checkpoint.h), as a Hugging Face model directory: config.json and the weights in
// the layout transformers loads (model.safetensors, or shards and an index), in float32 or, with
// `--dtype bfloat16`, rounded to bfloat16 (half the bytes, what Hugging Face users of bf16 models
// load; config.json's torch_dtype says which). The checkpoint keeps its float32 master weights. DIR
// is a training output directory (its latest checkpoint) or one checkpoint. Run it as one process.
// A LoRA run's checkpoint is exported with its adapter folded in (Model::merge_adapter_into).
// `trillion merge --checkpoint BASE --adapter DIR --out OUT` does the same for any weights and any
// PEFT adapter of them.
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
  std::string adapter;  // merge's --adapter; empty: a LoRA checkpoint's own adapter/
};

// export (merge = false) and merge (true, which needs an adapter).
void run_export(const ExportOptions& o, bool merge) {
  const std::string dir = merge ? resolve_weights_dir(o.checkpoint) : resolve_checkpoint_dir(o.checkpoint);
  if (fs::exists(fs::path(o.out) / "config.json"))
    fail(o.out, ": already holds a model (config.json); expected a new or empty directory");
  const ModelConfig config = ModelConfig::load((fs::path(dir) / "config.json").string());
  ModelConfig adapted_config = config;
  const std::string adapter = attach_adapter(adapted_config, dir, o.adapter);
  if (merge && adapter.empty())
    fail(dir, ": has no adapter/ (not a LoRA run's checkpoint); expected --adapter DIR, a PEFT adapter of it");
  Model<float> model(config);
  if (is_sharded_checkpoint(dir)) {
    if (!adapter.empty()) fail(dir, ": a sharded checkpoint with a LoRA adapter; expected whole weights");
    read_sharded_checkpoint<float>(dir, model.table(), model.params(), nullptr, nullptr);
  } else if (adapter.empty()) {
    model.load_weights(dir);
  } else {
    Model<float> adapted(adapted_config);
    adapted.load_weights(dir);
    adapted.load_adapter(adapter);
    adapted.merge_adapter_into(model);
  }
  fs::create_directories(o.out);
  model.save_weights(o.out, /*bfloat16=*/o.dtype == "bfloat16");
  nlohmann::json hf_config = config.to_json();
  hf_config["torch_dtype"] = o.dtype;
  write_file_atomic((fs::path(o.out) / "config.json").string(), hf_config.dump(2) + "\n");
  const std::string how = is_sharded_checkpoint(dir) ? "from its shards"
                          : adapter.empty()          ? "as saved"
                                                     : "with the adapter " + adapter + " merged";
  std::printf("exported %s to %s (%s, %s)\n", dir.c_str(), o.out.c_str(), how.c_str(), o.dtype.c_str());
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
  cmd->callback([o] { run_export(*o, /*merge=*/false); });

  auto m = std::make_shared<ExportOptions>();
  CLI::App* merge = app.add_subcommand("merge", "Fold a PEFT LoRA adapter into its base weights: a Hugging Face model");
  merge->add_option("--checkpoint", m->checkpoint, "The base: a checkpoint, training output or Hugging Face model directory")
      ->required();
  merge->add_option("--adapter", m->adapter, "The PEFT adapter directory (default: a LoRA run checkpoint's adapter/)");
  merge->add_option("--out", m->out, "Directory of the merged Hugging Face model")->required();
  merge->add_option("--dtype", m->dtype, "Stored type of the weights: float32 or bfloat16 (rounded to nearest even)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  merge->callback([m] { run_export(*m, /*merge=*/true); });
}

}  // namespace trillion
