// `trillion train --precision bf16`: a float32 run whose products take bf16 operands. It records the
// setting in trainer_state.json and keeps it on resume (an interrupted run resumes to the same bits
// as a straight one), its first loss is within bf16's unit roundoff of the float32 run's yet not
// equal to it, and a different precision on resume, or bf16 with float64, is refused by name.
// `eval` and `generate` take the checkpoint's precision unless --precision says otherwise.
// `export --dtype bfloat16` writes every weight rounded to bf16 (BF16 in the safetensors, the
// nearest bf16 of the checkpoint's float32 master weight) and torch_dtype in config.json; the
// exported model loads and evaluates.
#include <gtest/gtest.h>

#include <cmath>

#include "core/bf16.h"
#include "io/safetensors.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

TEST(PrecisionCli, Bf16RunIsRecordedResumesToTheSameBitsAndStaysNearFloat32) {
  const TestData& d = test_data();
  const fs::path fp32 = d.root / "precision_fp32", straight = d.root / "precision_bf16",
                 interrupted = d.root / "precision_bf16_interrupted";
  for (const fs::path& dir : {fp32, straight, interrupted}) fs::remove_all(dir);
  const std::string steps = " --steps 6";
  ASSERT_EQ(run_cli("train " + tiny_run_flags(fp32) + steps).status, 0);
  ASSERT_EQ(run_cli("train " + tiny_run_flags(straight) + steps + " --precision bf16").status, 0);
  const CommandResult stopped = run_cli("train " + tiny_run_flags(interrupted) + steps + " --precision bf16 --stop-after 3");
  ASSERT_EQ(stopped.status, 0) << stopped.output;
  const nlohmann::json state = nlohmann::json::parse(read_text(interrupted / "checkpoint-000003" / "trainer_state.json"));
  EXPECT_EQ(state.at("precision"), "bf16");
  const CommandResult resumed = run_cli("train --resume " + interrupted.string() + kSmallMfuGemm);
  ASSERT_EQ(resumed.status, 0) << resumed.output;

  const std::vector<nlohmann::json> a = read_metrics(straight), b = read_metrics(interrupted), f = read_metrics(fp32);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i + 1;
  const double loss_bf16 = a[0]["loss"].get<double>(), loss_fp32 = f[0]["loss"].get<double>();
  EXPECT_NE(loss_bf16, loss_fp32);
  EXPECT_LE(std::abs(loss_bf16 - loss_fp32), 0x1.0p-8 * loss_fp32);

  // eval: the checkpoint's precision by default; fp32 on request gives another loss nearby.
  const auto eval = [&](const std::string& flags) {
    const CommandResult r = run_cli("eval --checkpoint " + straight.string() + " --data " + d.data_dir.string() + flags);
    EXPECT_EQ(r.status, 0) << r.output;
    return nlohmann::json::parse(r.output.substr(r.output.rfind("\n{") + 1));
  };
  const nlohmann::json as_trained = eval(""), in_fp32 = eval(" --precision fp32");
  EXPECT_EQ(as_trained.at("precision"), "bf16");
  EXPECT_EQ(in_fp32.at("precision"), "fp32");
  const double val_bf16 = as_trained.at("val_loss").get<double>(), val_fp32 = in_fp32.at("val_loss").get<double>();
  EXPECT_NE(val_bf16, val_fp32);
  EXPECT_LE(std::abs(val_bf16 - val_fp32), 0x1.0p-8 * val_fp32);
  const CommandResult generated = run_cli("generate --checkpoint " + straight.string() + " --max-new-tokens 4");
  EXPECT_EQ(generated.status, 0) << generated.output;

  const fs::path exported = d.root / "precision_exported_bf16";
  fs::remove_all(exported);
  const CommandResult e = run_cli("export --checkpoint " + straight.string() + " --out " + exported.string() +
                                  " --dtype bfloat16");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_EQ(nlohmann::json::parse(read_text(exported / "config.json")).at("torch_dtype"), "bfloat16");
  const SafetensorsReader stored((exported / "model.safetensors").string());
  const SafetensorsReader master((straight / "checkpoint-000006" / "model.safetensors").string());
  ASSERT_EQ(stored.tensors().size(), master.tensors().size());
  for (const auto& [name, info] : master.tensors()) {
    ASSERT_EQ(stored.info(name).dtype, DType::BF16) << name;
    int64_t elements = 1;
    for (const int64_t extent : info.shape) elements *= extent;
    std::vector<float> rounded(elements), weights(elements);
    stored.read(name, info.shape, rounded.data());
    master.read(name, info.shape, weights.data());
    for (int64_t i = 0; i < elements; ++i) ASSERT_EQ(rounded[i], round_to_bf16(weights[i])) << name << " " << i;
  }
  const CommandResult loaded = run_cli("eval --checkpoint " + exported.string() + " --data " + d.data_dir.string() + " --seq-len 16");
  EXPECT_EQ(loaded.status, 0) << loaded.output;
}

TEST(PrecisionCli, AnotherPrecisionOnResumeAndBf16WithFloat64AreRefused) {
  const TestData& d = test_data();
  const fs::path out = d.root / "precision_refused";
  fs::remove_all(out);
  ASSERT_EQ(run_cli("train " + tiny_run_flags(out) + " --steps 2 --precision bf16").status, 0);
  const CommandResult other = run_cli("train --resume " + out.string() + " --precision fp32" + kSmallMfuGemm);
  EXPECT_NE(other.status, 0);
  EXPECT_NE(other.output.find("precision"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("bf16"), std::string::npos) << other.output;

  const CommandResult f64 =
      run_cli("train " + tiny_run_flags(d.root / "precision_f64") + " --steps 2 --dtype float64 --precision bf16");
  EXPECT_NE(f64.status, 0);
  EXPECT_NE(f64.output.find("--precision bf16 needs --dtype float32"), std::string::npos) << f64.output;
}

}  // namespace
}  // namespace trillion::train_test
