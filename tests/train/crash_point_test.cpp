// Crash points of training checkpoints (io/crash_points.h), through the real binary: a run resumed
// from checkpoint 2 toward checkpoint 4 is stopped right after each of its file operations in turn
// (every open, write, fsync, close, rename and directory sync of the metrics rewrite and of the new
// checkpoint), once as a process crash and once as a power loss (unsynced bytes and directory
// changes dropped). After each, `--resume` finds a complete checkpoint (2, or 4 once it is durable)
// and the finished run's losses and final weights are bitwise those of an uninterrupted run.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/crash_points.h"
#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

constexpr int64_t kSteps = 6;

// What an uninterrupted run and a crashed-and-resumed one must agree on, bit for bit.
struct RunOutcome {
  std::vector<double> losses;  // metrics.jsonl, one per step
  std::string weights, moments;  // the final checkpoint's model.safetensors and optimizer.safetensors
};

RunOutcome outcome_of(const fs::path& out) {
  RunOutcome outcome;
  for (const nlohmann::json& record : read_metrics(out)) outcome.losses.push_back(record.at("loss").get<double>());
  const fs::path last = out / checkpoint_name(kSteps);
  outcome.weights = read_text(last / "model.safetensors");
  outcome.moments = read_text(last / "optimizer.safetensors");
  return outcome;
}

void expect_same_outcome(const RunOutcome& got, const RunOutcome& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_FALSE(want.weights.empty());
  EXPECT_TRUE(got.weights == want.weights) << "final weights differ";
  EXPECT_TRUE(got.moments == want.moments) << "final optimizer state differs";
}

// Every crash point of the resumed run in one mode; returns how many there were.
int64_t crash_at_every_point(bool drop_unsynced) {
  const TestData& d = test_data();
  const std::string name = drop_unsynced ? "crash_points_drop" : "crash_points";
  const fs::path baseline = d.root / (name + "_baseline"), prefix = d.root / (name + "_prefix");
  const fs::path work = d.root / (name + "_work");
  const std::string flags = " --steps " + std::to_string(kSteps) + " --save-every 2";
  for (const fs::path& dir : {baseline, prefix}) fs::remove_all(dir);
  const CommandResult whole = run_cli("train " + tiny_run_flags(baseline) + flags);
  if (whole.status != 0) ADD_FAILURE() << whole.output;
  const CommandResult first = run_cli("train " + tiny_run_flags(prefix) + flags + " --stop-after 2");
  if (first.status != 0) ADD_FAILURE() << first.output;
  const RunOutcome want = outcome_of(baseline);

  const std::string crash_env = std::string("OMP_NUM_THREADS=1") + (drop_unsynced ? " TRILLION_CRASH_DROP_UNSYNCED=1" : "");
  int64_t k = 1;
  for (;; ++k) {
    SCOPED_TRACE(str_cat(name, ": crash point ", k));
    fs::remove_all(work);
    fs::copy(prefix, work, fs::copy_options::recursive);
    const CommandResult crashed = run_cli("train --resume " + work.string() + " --stop-after 4" + kSmallMfuGemm,
                                          crash_env + " TRILLION_CRASH_AFTER_FILE_OPS=" + std::to_string(k));
    if (crashed.status == 0) break;  // past the run's last file operation
    if (crashed.status != kCrashExitCode || crashed.output.find("crash point: stopped after") == std::string::npos) {
      ADD_FAILURE() << crashed.output;
      break;
    }
    const CommandResult resumed = run_cli("train --resume " + work.string() + kSmallMfuGemm);
    if (resumed.status != 0) {
      ADD_FAILURE() << crashed.output << resumed.output;
      break;
    }
    expect_same_outcome(outcome_of(work), want);
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("%s: %lld crash points, each resumed bitwise\n", name.c_str(), static_cast<long long>(k - 1));
  return k - 1;
}

TEST(CrashPoints, EveryFileOperationOfACheckpointCrashesIntoAResumableRun) {
  EXPECT_GE(crash_at_every_point(false), 30) << "the metrics rewrite and a checkpoint take dozens of file operations";
}

TEST(CrashPoints, EveryFileOperationOfACheckpointLosesOnlyUnsyncedWork) {
  EXPECT_GE(crash_at_every_point(true), 30) << "the metrics rewrite and a checkpoint take dozens of file operations";
}

}  // namespace
}  // namespace trillion::train_test
