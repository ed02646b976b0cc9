// `trillion train --data A:W,B:W`: a mixture of two data directories of one tokenizer trains,
// saves each source's position, resumes bitwise (same losses as an uninterrupted run), and
// refuses a resume with other weights.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

// A second data directory of the test tokenizer (other.txt's words, tokenized with it).
fs::path second_data_dir() {
  const TestData& d = test_data();
  const fs::path out = d.root / "mixture_b";
  if (!fs::exists(out / "train.bin")) {
    const CommandResult r = run_cli("tokenize --input " + (d.root / "other.txt").string() + " --out " + out.string() +
                                    " --tokenizer " + (d.data_dir / "tokenizer.model").string());
    EXPECT_EQ(r.status, 0) << r.output;
  }
  return out;
}

std::string mixture_flags(const fs::path& out, const std::string& spec) {
  const TestData& d = test_data();
  return "--config " + d.config_path.string() + " --data " + spec + " --out " + out.string() +
         " --batch 2 --seq-len 16 --lr 1e-2 --warmup 2 --log-every 100 --steps 8" + kSmallMfuGemm;
}

TEST(TrainMixture, TrainsSavesSourcePositionsAndResumesBitwise) {
  const TestData& d = test_data();
  const std::string spec = d.data_dir.string() + ":0.7," + second_data_dir().string() + ":0.3";
  const fs::path straight = d.root / "mixture_straight", interrupted = d.root / "mixture_interrupted";
  ASSERT_EQ(run_cli("train " + mixture_flags(straight, spec)).status, 0);
  const CommandResult first = run_cli("train " + mixture_flags(interrupted, spec) + " --stop-after 4");
  ASSERT_EQ(first.status, 0) << first.output;
  const nlohmann::json state =
      nlohmann::json::parse(read_text(interrupted / "checkpoint-000004" / "trainer_state.json"));
  ASSERT_EQ(state.at("source_positions").size(), 2u);
  EXPECT_EQ(state["source_positions"][0].get<int64_t>() + state["source_positions"][1].get<int64_t>(),
            state.at("sampler_position").get<int64_t>());
  EXPECT_EQ(state.at("sampler_position"), 8);  // 4 steps × 2 windows
  EXPECT_NE(state.at("data_dir").get<std::string>().find(":0.29999999999999999"), std::string::npos) << state.dump();

  const CommandResult second = run_cli("train --resume " + interrupted.string() + kSmallMfuGemm);
  ASSERT_EQ(second.status, 0) << second.output;
  const std::vector<nlohmann::json> a = read_metrics(straight), b = read_metrics(interrupted);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i + 1;
  EXPECT_EQ(read_text(straight / "checkpoint-000008" / "model.safetensors"),
            read_text(interrupted / "checkpoint-000008" / "model.safetensors"));

  // Other weights are other data: the resume is refused.
  const std::string other = d.data_dir.string() + ":0.5," + second_data_dir().string() + ":0.5";
  const CommandResult refused = run_cli("train --resume " + (interrupted / "checkpoint-000004").string() + " --out " +
                                        (d.root / "mixture_refused").string() + " --data " + other + kSmallMfuGemm);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("'train_checksum'"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace trillion::train_test
