// `trillion eval`: validation loss of a checkpoint on the val split of a tokenized data directory:
// nats/token, perplexity, bits per byte, and the unigram and bigram baselines of the same split
// (fit on the train tokens; data/baselines.h), printed for people and as a final JSON line. Sparse attention layers
// attend as the checkpoint was trained (its trainer_state's indexer mode: sparse over the top-k, or dense in the
// warm-up and dense stages) unless --indexer-mode says otherwise. --indexer-recall attends densely
// and reports, per sparse layer, the mass of that dense attention on the indexer's top-k, and the
// most mass any top-k keys hold (the sum of each query's top-k probabilities: the ceiling of any
// selection): over every query, and over the queries that see more than top-k keys (the first top-k
// queries of a window select every key they see, so their mass is 1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "data/baselines.h"
#include "data/shards.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/run_setup.h"

namespace trillion {
namespace {
namespace fs = std::filesystem;

struct EvalOptions {
  std::string checkpoint;
  std::string data_dir;
  int64_t seq_len = 0;  // 0: the checkpoint's training seq_len (256 without trainer state)
  int64_t batch = 8;
  int64_t max_batches = 0;  // 0: every window
  std::string indexer_mode;  // "dense" | "warmup" | "sparse"; empty: the checkpoint's (sparse without state)
  std::string precision;     // "fp32" | "bf16"; empty: the checkpoint's (fp32 without state)
  std::string adapter;       // a PEFT LoRA adapter on the weights; empty: the checkpoint's own, if any
  bool indexer_recall = false;  // dense attention, and its mass on each indexer's selection
};

template <class T>
EvalResult evaluate_checkpoint(const ModelConfig& config, const std::string& weights_dir, const std::string& adapter,
                               const DataDir& data, const EvalOptions& o) {
  Model<T> model(config);
  model.load_weights(weights_dir);
  if (!adapter.empty()) model.load_adapter(adapter);
  if (o.indexer_recall) {
    if (model.sparse_layers() == 0)
      fail("--indexer-recall: ", weights_dir, "/config.json has no sparse_attention layer");
    model.set_indexer_training(IndexerMode::dense, 1.0);  // the loss's pass measures the selected mass
  } else {
    model.set_indexer_training(indexer_mode_from_name(o.indexer_mode), 0.0);  // warmup and dense attend densely
  }
  return evaluate_loss(model, data.val.streams(), o.seq_len, o.batch, o.max_batches);
}

void run_eval(EvalOptions o) {
  const std::string weights_dir = resolve_weights_dir(o.checkpoint);
  ModelConfig config = ModelConfig::load((fs::path(weights_dir) / "config.json").string());
  const std::string adapter = attach_adapter(config, weights_dir, o.adapter);
  const DataDir data = open_data_dir(o.data_dir, config.vocab_size);
  std::string dtype = "float32";
  const fs::path state_path = fs::path(weights_dir) / "trainer_state.json";
  std::optional<TrainerState> saved;
  if (fs::exists(state_path)) {
    const TrainerState& state = saved.emplace(TrainerState::load(state_path.string()));
    if (state.tokenizer_hash != data.val.tokenizer_hash) {
      fail(state_path.string(), ": field 'tokenizer_hash' does not match the tokenizer of ", data.val.path,
           "; the checkpoint was trained with a different tokenizer");
    }
    dtype = state.settings.dtype;
    if (o.seq_len == 0) o.seq_len = state.settings.seq_len;
    if (o.indexer_mode.empty()) o.indexer_mode = state.settings.indexer_mode;
  }
  if (o.seq_len == 0) o.seq_len = 256;
  if (o.indexer_mode.empty()) o.indexer_mode = "sparse";
  const MatmulPrecision precision = checkpoint_matmul_precision(o.precision, saved ? &saved->settings : nullptr);
  set_matmul_precision(precision);
  if (o.seq_len < 1 || o.seq_len > config.max_position_embeddings) {
    fail("--seq-len must be in [1, max_position_embeddings=", config.max_position_embeddings, "], got ", o.seq_len);
  }
  if (o.batch < 1) fail("--batch must be ≥ 1, got ", o.batch);
  if (data.val.token_count() < 2) fail(data.val.path, ": needs at least 2 tokens to evaluate");

  const EvalResult r = dtype == "float64" ? evaluate_checkpoint<double>(config, weights_dir, adapter, data, o)
                                          : evaluate_checkpoint<float>(config, weights_dir, adapter, data, o);
  const double loss = r.loss();
  // Bytes of text behind the evaluated targets: the split's bytes in proportion when truncated.
  const double text_bytes = static_cast<double>(data.val.text_bytes) * static_cast<double>(r.target_count) /
                            static_cast<double>(r.total_targets);
  const double bits_per_byte = text_bytes > 0 ? r.loss_sum / std::log(2.0) / text_bytes : 0.0;
  const double unigram = unigram_baseline_nats(data.train.streams(), data.val.streams(), config.vocab_size);
  const double bigram = bigram_baseline_nats(data.train.streams(), data.val.streams(), config.vocab_size);

  std::printf("checkpoint     %s\n", weights_dir.c_str());
  std::printf("val windows    %lld of %lld (seq_len %lld), %lld target tokens\n", static_cast<long long>(r.windows),
              static_cast<long long>(r.total_windows), static_cast<long long>(o.seq_len),
              static_cast<long long>(r.target_count));
  std::printf("val loss       %.4f nats/token (baselines: unigram %.4f, bigram %.4f)\n", loss, unigram, bigram);
  std::printf("perplexity     %.3f\n", std::exp(loss));
  std::printf("bits per byte  %.4f\n", bits_per_byte);
  nlohmann::json recall = nlohmann::json::array();
  // The share of a window's queries whose top-k holds every key they see (eval's windows are whole).
  const double whole = double(std::min(config.index_topk, o.seq_len)) / double(o.seq_len);
  const auto beyond_topk = [&](double mass) {  // mean over the queries that see more than top-k keys
    return whole < 1.0 ? nlohmann::json((mass - whole) / (1.0 - whole)) : nlohmann::json(nullptr);
  };
  for (const IndexerLayerStats& layer : r.indexer) {
    const nlohmann::json beyond = beyond_topk(layer.selected_mass), best_beyond = beyond_topk(layer.best_mass);
    std::printf(
        "layer %d: dense attention's mass on the indexer's top-%lld %.4f over every query, %s over those "
        "seeing more keys; on its own top-%lld %.4f and %s (indexer KL %.4f)\n",
        layer.layer, static_cast<long long>(config.index_topk), layer.selected_mass, beyond.dump().c_str(),
        static_cast<long long>(config.index_topk), layer.best_mass, best_beyond.dump().c_str(), layer.loss);
    recall.push_back({{"layer", layer.layer},
                      {"selected_mass", layer.selected_mass},
                      {"selected_mass_beyond_topk", beyond},
                      {"best_mass", layer.best_mass},
                      {"best_mass_beyond_topk", best_beyond},
                      {"indexer_loss", layer.loss}});
  }
  nlohmann::json summary = {{"checkpoint", weights_dir},
                            {"val_loss", loss},
                            {"perplexity", std::exp(loss)},
                            {"bits_per_byte", bits_per_byte},
                            {"unigram_baseline_nats", unigram},
                            {"bigram_baseline_nats", bigram},
                            {"tokens", r.target_count},
                            {"windows", r.windows},
                            {"total_windows", r.total_windows},
                            {"seq_len", o.seq_len},
                            {"dtype", dtype},
                            {"precision", matmul_precision_name(precision)},
                            {"indexer_mode", o.indexer_recall ? "dense" : o.indexer_mode}};
  if (o.indexer_recall) summary["indexer_recall"] = recall;
  std::printf("%s\n", summary.dump().c_str());
}

}  // namespace

void register_eval(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss, perplexity and bits per byte of a checkpoint");
  auto options = std::make_shared<EvalOptions>();
  cmd->add_option("--checkpoint", options->checkpoint, "Checkpoint directory or a training --out directory")->required();
  cmd->add_option("--data", options->data_dir, "Directory written by `trillion tokenize`")->required();
  cmd->add_option("--seq-len", options->seq_len, "Tokens per window (default: the checkpoint's training seq_len)");
  cmd->add_option("--batch", options->batch, "Windows per forward pass");
  cmd->add_option("--max-batches", options->max_batches, "Evaluate only the first N batches (0: all)");
  CLI::Option* mode =
      cmd->add_option(
             "--indexer-mode", options->indexer_mode,
             "Sparse attention layers: sparse (top-k) or dense / warmup (dense attention); default: as trained")
          ->check(CLI::IsMember({"dense", "warmup", "sparse"}));
  cmd->add_flag("--indexer-recall", options->indexer_recall,
                "Attend densely and report each sparse layer's dense attention mass on its indexer's top-k "
                "and the most any top-k keys hold")
      ->excludes(mode);
  cmd->add_option("--precision", options->precision,
                  "Operands of the products: fp32 or bf16 (float accumulation); default: as trained")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--adapter", options->adapter,
                  "A PEFT LoRA adapter directory on the checkpoint's weights (default: a LoRA run's own adapter/)");
  cmd->callback([options] {
    run_eval(*options);
  });
}

}  // namespace trillion
