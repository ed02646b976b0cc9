// `trillion train --document-mask`: trains with document masks (the data's eos ends documents),
// records the setting in the checkpoint and keeps it on resume; sparse attention trains with it.
#include <gtest/gtest.h>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(DocumentMaskCli, TrainsRecordsTheSettingAndKeepsItOnResumeForEveryMixer) {
  const TestData& d = test_data();
  const fs::path out = d.root / "document_mask";
  fs::remove_all(out);
  const CommandResult first = run_cli("train " + tiny_run_flags(out) + " --steps 4 --stop-after 2 --document-mask");
  ASSERT_EQ(first.status, 0) << first.output;
  const nlohmann::json state = nlohmann::json::parse(read_text(out / "checkpoint-000002" / "trainer_state.json"));
  EXPECT_EQ(state.at("document_mask"), true);
  const CommandResult resumed = run_cli("train --resume " + out.string() + kSmallMfuGemm);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(read_metrics(out).size(), 4u);

  // Sparse attention (the indexer's top-k and loss) trains with the mask too.
  const fs::path sparse = config_with("tiny_qwen3_sparse", nullptr);
  const CommandResult trained =
      run_cli("train --config " + sparse.string() + " --data " + d.data_dir.string() + " --out " +
              (d.root / "document_mask_sparse").string() + " --steps 2 --batch 2 --seq-len 16 --document-mask" + kSmallMfuGemm);
  EXPECT_EQ(trained.status, 0) << trained.output;
}

}  // namespace
}  // namespace trillion::train_test
