// A real training run killed (SIGKILL) at 20 seeded random moments while it steps and checkpoints
// every step with --keep-last 2, each time resumed (or started again while no checkpoint is
// complete): the finished run's losses and final weights are bitwise those of an uninterrupted
// run, and only the newest two checkpoints remain. Also --keep-last's own rules.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

constexpr int64_t kSteps = 400;  // 20 kills reach step ~80 here: start-up takes most of each try
constexpr int kKills = 20;

// Checkpoint directories (complete ones, by name) in `out`.
std::vector<std::string> checkpoints_in(const fs::path& out) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(KillResume, TwentyRandomKillsResumeIntoTheUninterruptedRun) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const TestData& d = test_data();
  const fs::path baseline = d.root / "kill_baseline", work = d.root / "kill_work", log = d.root / "kill.log";
  for (const fs::path& dir : {baseline, work}) fs::remove_all(dir);
  const std::string steps = " --steps " + std::to_string(kSteps);
  const CommandResult whole = run_cli("train " + tiny_run_flags(baseline) + steps);
  ASSERT_EQ(whole.status, 0) << whole.output;

  const CounterRng rng(12, "kill delays");
  int kills = 0;
  std::string killed_at;  // the latest checkpoint after each kill
  for (int attempt = 0;; ++attempt) {
    const std::string saving = " --save-every 1 --keep-last 2";  // process options: given on every start
    const std::string args = fs::exists(work / "latest") ? "train --resume " + work.string() + kSmallMfuGemm + saving
                                                         : "train " + tiny_run_flags(work) + steps + saving;
    if (kills == kKills) {  // the last resume runs to the end
      const CommandResult last = run_cli(args);
      ASSERT_EQ(last.status, 0) << last.output;
      break;
    }
    const pid_t pid = spawn_trillion(args, log);
    ASSERT_GT(pid, 0);
    // Kill after 10–100 ms (start-up takes some; a tiny step and its checkpoint about 1 ms), unless
    // the run ends first.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(10000 + int64_t(rng.uniform(attempt) * 90000));
    int status = 0;
    pid_t done = 0;
    while (done == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      done = waitpid(pid, &status, WNOHANG);
    }
    if (done == 0) {
      kill(pid, SIGKILL);
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ++kills;
      killed_at += ' ';
      killed_at += fs::exists(work / "latest") ? read_text(work / "latest").substr(11, 6) : std::string("-");
      continue;
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_text(log);
    break;  // finished before its kill: fewer kills than asked, reported below
  }
  EXPECT_EQ(kills, kKills) << "the run finished before " << kKills << " kills; make it longer";
  std::printf("latest checkpoint after each kill:%s\n", killed_at.c_str());

  // Bitwise the uninterrupted run: every step's loss, the final weights and moments.
  std::vector<double> got, want;
  for (const nlohmann::json& r : read_metrics(work)) got.push_back(r.at("loss").get<double>());
  for (const nlohmann::json& r : read_metrics(baseline)) want.push_back(r.at("loss").get<double>());
  EXPECT_EQ(got.size(), size_t(kSteps));
  EXPECT_EQ(got, want);
  const fs::path last = fs::path(checkpoint_name(kSteps));
  EXPECT_TRUE(read_text(work / last / "model.safetensors") == read_text(baseline / last / "model.safetensors"));
  EXPECT_TRUE(read_text(work / last / "optimizer.safetensors") == read_text(baseline / last / "optimizer.safetensors"));
  const std::vector<std::string> kept = checkpoints_in(work);
  EXPECT_EQ(kept, (std::vector<std::string>{checkpoint_name(kSteps - 1), checkpoint_name(kSteps)}));
  for (const auto& entry : fs::directory_iterator(work))
    EXPECT_NE(entry.path().filename().string()[0], '.') << "left behind: " << entry.path();
}

// --keep-last N keeps the newest N of the checkpoints up to the one just written (later ones, left
// by a run resumed from an older checkpoint, are not older and stay) and clears hidden leftovers.
TEST(KeepLast, RemovesOnlyOlderCheckpointsAndLeftovers) {
  const fs::path out = test_data().root / "keep_last";
  fs::remove_all(out);
  for (int64_t step : {1, 2, 3, 4, 6}) fs::create_directories(out / checkpoint_name(step));
  fs::create_directories(out / ".checkpoint-000005.tmp.99999");
  fs::create_directories(out / "not-a-checkpoint");
  prune_checkpoints(out.string(), 4, 2);
  EXPECT_EQ(checkpoints_in(out), (std::vector<std::string>{checkpoint_name(3), checkpoint_name(4), checkpoint_name(6)}));
  EXPECT_FALSE(fs::exists(out / ".checkpoint-000005.tmp.99999"));
  EXPECT_TRUE(fs::exists(out / "not-a-checkpoint"));
  prune_checkpoints(out.string(), 4, 0);  // 0 keeps every checkpoint
  EXPECT_EQ(checkpoints_in(out).size(), 3u);
  prune_checkpoints(out.string(), 6, 1);
  EXPECT_EQ(checkpoints_in(out), (std::vector<std::string>{checkpoint_name(6)}));
}

}  // namespace
}  // namespace trillion::train_test
