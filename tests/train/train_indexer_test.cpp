// `trillion train` on a tiny DeepSeek-V3.2 model (two sparse MLA layers with lightning indexers):
// the indexer warm-up changes the indexers' tensors and nothing else, its metrics carry the indexer
// loss and the selected attention mass per sparse layer, the sparse stage then trains every tensor
// from that checkpoint, eval attends as the checkpoint was trained and measures the indexers'
// recall of dense attention, and the indexer flags are refused on a model without sparse layers.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

fs::path sparse_config() {
  static const fs::path path = [] {
    nlohmann::json config = nlohmann::json::parse(
        read_file(std::string(TRILLION_SOURCE_DIR) + "/configs/models/tiny_deepseek_v32.json"));
    config["vocab_size"] = test_data().vocab_size;
    config["initializer_range"] = 0.02;
    config["index_topk"] = 5;
    const fs::path out = test_data().root / "tiny_deepseek_v32.json";
    write_text(out, config.dump(2));
    return out;
  }();
  return path;
}

std::string flags(const fs::path& out) {
  return " --data " + test_data().data_dir.string() + " --out " + out.string() +
         " --batch 2 --seq-len 16 --lr 1e-2 --warmup 1 --log-every 10 --steps 3" + kSmallMfuGemm;
}

// Every tensor of two checkpoints, by name: whether it differs.
std::map<std::string, bool> changed(const fs::path& a, const fs::path& b) {
  const SafetensorsReader x((a / "model.safetensors").string()), y((b / "model.safetensors").string());
  std::map<std::string, bool> result;
  for (const auto& [name, info] : x.tensors()) {
    int64_t numel = 1;
    for (int64_t d : info.shape) numel *= d;
    std::vector<float> u(numel), v(numel);
    x.read(name, info.shape, u.data());
    y.read(name, info.shape, v.data());
    result[name] = u != v;
  }
  return result;
}

TEST(TrainIndexer, WarmupTrainsOnlyTheIndexersThenSparseTrainsAll) {
  const fs::path base = test_data().root / "indexer_base", warm = test_data().root / "indexer_warm",
                 sparse = test_data().root / "indexer_sparse";
  ASSERT_EQ(run_cli("train --config " + sparse_config().string() + flags(base) + " --indexer-mode dense "
                    "--indexer-loss-coef 0").status, 0);
  const CommandResult w = run_cli("train --init " + (base / "checkpoint-000003").string() + flags(warm) +
                                  " --indexer-mode warmup --indexer-loss-coef 1");
  ASSERT_EQ(w.status, 0) << w.output;
  for (const nlohmann::json& m : read_metrics(warm)) {
    ASSERT_EQ(m.at("sparse_layers").size(), 2u) << m.dump();
    EXPECT_GT(m.at("indexer_loss").get<double>(), 0.0);
    const double mass = m.at("indexer_selected_mass");
    EXPECT_GT(mass, 0.0);
    EXPECT_LT(mass, 1.0);  // 5 of up to 16 keys, attention dense
    for (const nlohmann::json& layer : m.at("sparse_layers")) {
      const double best = layer.at("best_mass");
      EXPECT_LT(best, 1.0);
      EXPECT_GE(best, layer.at("selected_mass").get<double>() - 1e-12) << "no top-5 holds more than the five largest";
    }
    EXPECT_NEAR(m.at("loss").get<double>(), m.at("lm_loss").get<double>() + m.at("indexer_loss").get<double>(), 1e-6);
  }
  int indexer_tensors = 0;
  for (const auto& [name, differs] : changed(base / "checkpoint-000003", warm / "checkpoint-000003")) {
    const bool indexer = name.find(".self_attn.indexer.") != std::string::npos;
    indexer_tensors += indexer;
    EXPECT_EQ(differs, indexer) << name;
  }
  EXPECT_EQ(indexer_tensors, 10);
  const nlohmann::json state = nlohmann::json::parse(read_text(warm / "checkpoint-000003" / "trainer_state.json"));
  EXPECT_EQ(state.at("indexer").at("mode"), "warmup");
  // eval attends as the checkpoint was trained (dense in the warm-up) unless told otherwise.
  const auto eval = [&](const std::string& extra) {
    const CommandResult r = run_cli("eval --checkpoint " + warm.string() + " --data " + test_data().data_dir.string() +
                                        " --seq-len 16" + extra, "OMP_NUM_THREADS=1", /*stdout_only=*/true);
    EXPECT_EQ(r.status, 0) << r.output;
    return last_json_line(r.output);
  };
  const nlohmann::json as_trained = eval(""), sparse_eval = eval(" --indexer-mode sparse");
  EXPECT_EQ(as_trained.at("indexer_mode"), "warmup");
  EXPECT_EQ(sparse_eval.at("indexer_mode"), "sparse");
  EXPECT_NE(as_trained.at("val_loss"), sparse_eval.at("val_loss"));  // 5 of up to 16 keys
  // --indexer-recall: dense attention, and its mass on each indexer's top-5, over the windows; with
  // windows of 5 tokens the top-5 holds every visible key.
  const nlohmann::json recall = eval(" --indexer-recall");
  EXPECT_EQ(recall.at("indexer_mode"), "dense");
  EXPECT_EQ(recall.at("val_loss"), as_trained.at("val_loss")) << "measuring changes no logit";
  ASSERT_EQ(recall.at("indexer_recall").size(), 2u) << recall.dump();
  for (const nlohmann::json& layer : recall.at("indexer_recall")) {
    const double mass = layer.at("selected_mass"), beyond = layer.at("selected_mass_beyond_topk");
    EXPECT_GT(beyond, 0.0);
    EXPECT_LT(beyond, mass) << "the first 5 queries of each window select every key they see";
    EXPECT_LT(mass, 1.0 - 1e-3);
    const double best = layer.at("best_mass"), best_beyond = layer.at("best_mass_beyond_topk");
    EXPECT_GE(best, mass - 1e-12) << "no top-5 holds more than the five largest";
    EXPECT_GE(best_beyond, beyond - 1e-12);
    EXPECT_LT(best, 1.0 - 1e-3);
  }
  const CommandResult short_windows = run_cli("eval --checkpoint " + warm.string() + " --data " +
                                                  test_data().data_dir.string() + " --seq-len 5 --indexer-recall",
                                              "OMP_NUM_THREADS=1", /*stdout_only=*/true);
  ASSERT_EQ(short_windows.status, 0) << short_windows.output;
  const nlohmann::json short_summary = last_json_line(short_windows.output);  // outlives the loop over its layers
  for (const nlohmann::json& layer : short_summary.at("indexer_recall")) {
    EXPECT_NEAR(layer.at("selected_mass").get<double>(), 1.0, 1e-6);
    EXPECT_NEAR(layer.at("best_mass").get<double>(), 1.0, 1e-6);
    EXPECT_TRUE(layer.at("selected_mass_beyond_topk").is_null()) << "no query sees more than 5 keys";
  }

  const CommandResult s = run_cli("train --init " + (warm / "checkpoint-000003").string() + flags(sparse) +
                                  " --indexer-mode sparse");
  ASSERT_EQ(s.status, 0) << s.output;
  for (const nlohmann::json& m : read_metrics(sparse)) EXPECT_NEAR(m.at("indexer_selected_mass").get<double>(), 1.0, 1e-6);
  for (const auto& [name, differs] : changed(warm / "checkpoint-000003", sparse / "checkpoint-000003"))
    EXPECT_EQ(differs, name.find("e_score_correction_bias") == std::string::npos) << name;  // a buffer
}

TEST(TrainIndexer, FlagsNeedSparseLayers) {
  const CommandResult r = run_cli("train --config " + test_data().config_path.string() + flags(test_data().root / "no_idx") +
                                  " --indexer-mode warmup");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("the model has no sparse attention layers"), std::string::npos) << r.output;
  const CommandResult e = run_cli("eval --checkpoint " + trained_run().string() + " --data " +
                                  test_data().data_dir.string() + " --indexer-recall");
  EXPECT_EQ(e.status, 1) << e.output;
  EXPECT_NE(e.output.find("config.json has no sparse_attention layer"), std::string::npos) << e.output;
  const CommandResult both = run_cli("eval --checkpoint " + trained_run().string() + " --data " +
                                     test_data().data_dir.string() + " --indexer-recall --indexer-mode sparse");
  EXPECT_NE(both.status, 0) << "--indexer-recall attends densely: no --indexer-mode beside it";
}

}  // namespace
}  // namespace trillion::train_test
