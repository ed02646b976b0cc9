// Numeric guards (train/numeric_guard.h) through the binary, with a NaN written into one layer's
// output at one step (the TRILLION_TEST_NAN_AFTER_LAYER hook): the default stop names the step, the
// layer (--check-numerics) and the first non-finite gradient, exits non-zero and leaves the last
// checkpoint intact, from which the run resumes into bitwise the uninterrupted run; skip drops the
// step's update (weights, moments and router biases as before it, data consumed, schedule advanced,
// the skip counted) and goes on, on every rank together under mpirun; more skips in a row than
// allowed end the run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

const std::string kNanAtStep3 = "OMP_NUM_THREADS=1 TRILLION_TEST_NAN_AFTER_LAYER=1@3";

std::vector<nlohmann::json> losses_json(const fs::path& out) {
  std::vector<nlohmann::json> losses;
  for (const nlohmann::json& record : read_metrics(out)) losses.push_back(record.at("loss"));
  return losses;
}

TEST(NumericGuard, StopNamesTheStepLayerAndGradientAndKeepsTheLastCheckpoint) {
  const TestData& d = test_data();
  const fs::path out = d.root / "nonfinite_stop", baseline = d.root / "nonfinite_baseline";
  for (const fs::path& dir : {out, baseline}) fs::remove_all(dir);
  const std::string flags = " --steps 6 --save-every 2";
  const CommandResult stopped = run_cli("train " + tiny_run_flags(out) + flags + " --check-numerics", kNanAtStep3);
  EXPECT_EQ(stopped.status, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("error: step 3: the loss is nan"), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("the first non-finite gradient in backward order is "), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("the first non-finite layer output: layer 1 (full_attention) FFN output"),
            std::string::npos)
      << stopped.output;
  EXPECT_EQ(read_text(out / "latest"), checkpoint_name(2) + "\n");
  EXPECT_EQ(read_metrics(out).size(), 2u) << "nothing of step 3 was recorded";

  // Without --check-numerics the gradient is still named, and the flag suggested.
  const CommandResult plain = run_cli("train " + tiny_run_flags(d.root / "nonfinite_plain") + flags, kNanAtStep3);
  EXPECT_EQ(plain.status, 1) << plain.output;
  EXPECT_NE(plain.output.find("--check-numerics names the first non-finite layer output"), std::string::npos)
      << plain.output;

  // The kept checkpoint resumes (no NaN now) into the uninterrupted run, bit for bit.
  ASSERT_EQ(run_cli("train " + tiny_run_flags(baseline) + flags).status, 0);
  const CommandResult resumed = run_cli("train --resume " + out.string() + kSmallMfuGemm);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(losses_json(out), losses_json(baseline));
  EXPECT_TRUE(read_text(out / checkpoint_name(6) / "model.safetensors") ==
              read_text(baseline / checkpoint_name(6) / "model.safetensors"));
}

TEST(NumericGuard, SkipDropsTheUpdateButConsumesTheStep) {
  const TestData& d = test_data();
  const fs::path config_path = config_with("tiny_glm4_moe", nullptr), out = d.root / "nonfinite_skip";
  fs::remove_all(out);
  // A sigmoid router with aux-loss-free biases: those must stay too.
  const std::string flags = "train --config " + config_path.string() + " --data " + d.data_dir.string() + " --out " +
                            out.string() + " --batch 2 --seq-len 16 --steps 5 --save-every 1 --moe-bias-rate 1e-2" +
                            kSmallMfuGemm;
  const CommandResult run = run_cli(flags + " --on-nonfinite skip", kNanAtStep3);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("skipped (--on-nonfinite skip): step 3: "), std::string::npos) << run.output;
  const std::vector<nlohmann::json> metrics = read_metrics(out);
  ASSERT_EQ(metrics.size(), 5u);
  EXPECT_TRUE(metrics[2].at("loss").is_null());
  EXPECT_NE(metrics[2].at("skipped").get<std::string>().find("not finite"), std::string::npos);
  EXPECT_EQ(metrics[2].at("nonfinite_skips"), 1);
  EXPECT_EQ(metrics[4].at("nonfinite_skips"), 1);
  EXPECT_TRUE(metrics[3].at("loss").is_number());
  // The update was dropped: weights (with the router biases) and AdamW moments as after step 2.
  const fs::path two = out / checkpoint_name(2), three = out / checkpoint_name(3);
  EXPECT_TRUE(read_text(two / "model.safetensors") == read_text(three / "model.safetensors"));
  EXPECT_TRUE(read_text(two / "optimizer.safetensors") == read_text(three / "optimizer.safetensors"));
  EXPECT_FALSE(read_text(three / "model.safetensors") == read_text(out / checkpoint_name(4) / "model.safetensors"));
  // The step still counts: its data consumed, its learning rate that of step 3, the skip saved.
  const nlohmann::json state2 = nlohmann::json::parse(read_text(two / "trainer_state.json"));
  const nlohmann::json state3 = nlohmann::json::parse(read_text(three / "trainer_state.json"));
  EXPECT_EQ(state3.at("step"), 3);
  EXPECT_EQ(state3.at("sampler_position").get<int64_t>() - state2.at("sampler_position").get<int64_t>(), 2);
  EXPECT_EQ(state3.at("nonfinite_skips"), 1);
  EXPECT_NE(metrics[2].at("lr").get<double>(), metrics[1].at("lr").get<double>());

  // More non-finite steps in a row than allowed end the run.
  fs::remove_all(out);
  const CommandResult strict = run_cli(flags + " --on-nonfinite skip --max-nonfinite-skips 0", kNanAtStep3);
  EXPECT_EQ(strict.status, 1) << strict.output;
  EXPECT_NE(strict.output.find("1 steps in a row were not finite, more than --max-nonfinite-skips 0"),
            std::string::npos)
      << strict.output;
}

// Under mpirun (FSDP with expert parallelism) the decision is collective: both ranks skip step 3
// and go on to the end.
TEST(NumericGuard, RanksSkipTogetherUnderMpirun) {
  const TestData& d = test_data();
  const fs::path config_path = config_with("tiny_qwen3_moe", nullptr), out = d.root / "nonfinite_mpi";
  fs::remove_all(out);
  const CommandResult run = run_shell(
      kNanAtStep3 + " " + mpirun_launcher(2) + " -x " +
      "TRILLION_TEST_NAN_AFTER_LAYER " + TRILLION_BINARY + " train --config " + config_path.string() + " --data " +
      d.data_dir.string() + " --out " + out.string() + " --batch 2 --seq-len 16 --steps 4 --ep 2 --on-nonfinite skip" +
      kSmallMfuGemm + " 2>&1");
  ASSERT_EQ(run.status, 0) << run.output;
  const std::vector<nlohmann::json> metrics = read_metrics(out);
  ASSERT_EQ(metrics.size(), 4u);
  EXPECT_TRUE(metrics[2].at("loss").is_null());
  EXPECT_TRUE(metrics[3].at("loss").is_number());
  EXPECT_EQ(read_text(out / "latest"), checkpoint_name(4) + "\n");
}

}  // namespace
}  // namespace trillion::train_test
