// Preemption (train/stop_signals.h) of a real run: SIGTERM mid-run finishes the step, writes a
// checkpoint and exits 0 with the command to continue, and `--resume` then ends bitwise where an
// uninterrupted run ends; a second signal right after the first exits at once (128 + signal) and
// the last complete checkpoint (of --save-every) still resumes bitwise.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

constexpr int64_t kSteps = 400;

std::vector<double> losses_of(const fs::path& out) {
  std::vector<double> losses;
  for (const nlohmann::json& record : read_metrics(out)) losses.push_back(record.at("loss").get<double>());
  return losses;
}

// Lines in OUT/metrics.jsonl (0 while it does not exist).
size_t metric_lines(const fs::path& out) {
  const std::string text = fs::exists(out / "metrics.jsonl") ? read_text(out / "metrics.jsonl") : std::string();
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// The uninterrupted run, made once.
const fs::path& baseline() {
  static const fs::path out = [] {
    const fs::path dir = test_data().root / "preemption_baseline";
    fs::remove_all(dir);
    const CommandResult r = run_cli("train " + tiny_run_flags(dir) + " --steps " + std::to_string(kSteps));
    if (r.status != 0) throw std::runtime_error("train failed: " + r.output);
    return dir;
  }();
  return out;
}

// The processes whose parent is `pid` (mpirun's ranks).
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  for (pid_t child; in >> child;) children.push_back(child);
  return children;
}

// Starts the run in `out` (behind `launcher`), waits until it has logged `lines` steps, sends
// `signals` back to back (to the last of mpirun's ranks when launched by mpirun) and returns its
// wait status.
int signal_run_after(const fs::path& out, const std::string& extra, size_t lines, const std::vector<int>& signals,
                     const std::string& launcher = "") {
  fs::remove_all(out);
  const pid_t pid = spawn_trillion("train " + tiny_run_flags(out) + " --steps " + std::to_string(kSteps) + extra,
                                   out.string() + ".log", launcher);
  EXPECT_GT(pid, 0);
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (metric_lines(out) < lines && std::chrono::steady_clock::now() < give_up) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;  // ended early: the caller's checks fail
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::vector<pid_t> ranks = children_of(pid);
  const pid_t target = launcher.empty() || ranks.empty() ? pid : ranks.back();
  for (int signal : signals) kill(target, signal);
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

void expect_resume_matches(const fs::path& out, const fs::path& uninterrupted, const std::string& launcher = "") {
  const CommandResult resumed =
      run_shell("OMP_NUM_THREADS=1 " + launcher + " " + TRILLION_BINARY + " train --resume " + out.string() + kSmallMfuGemm + " 2>&1");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(losses_of(out), losses_of(uninterrupted));
  const fs::path last = fs::path(checkpoint_name(kSteps));
  EXPECT_TRUE(read_text(out / last / "model.safetensors") == read_text(uninterrupted / last / "model.safetensors"));
  EXPECT_TRUE(read_text(out / last / "optimizer.safetensors") ==
              read_text(uninterrupted / last / "optimizer.safetensors"));
}

TEST(Preemption, SigtermCheckpointsExitsZeroAndResumesBitwise) {
  setenv("OMP_NUM_THREADS", "1", 1);
  baseline();
  const fs::path out = test_data().root / "preemption_term";
  const int status = signal_run_after(out, "", 20, {SIGTERM});
  const std::string log = read_text(out.string() + ".log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(log.find("continue with: trillion train --resume " + out.string()), std::string::npos) << log;
  // Stopped after the step it was in: its checkpoint is the latest, and the metrics end there.
  const size_t steps_done = metric_lines(out);
  EXPECT_GE(steps_done, 20u);
  EXPECT_LT(steps_done, size_t(kSteps));
  EXPECT_EQ(read_text(out / "latest"), checkpoint_name(int64_t(steps_done)) + "\n");
  expect_resume_matches(out, baseline());
}

TEST(Preemption, ASecondSignalExitsAtOnceAndTheLastCheckpointResumes) {
  setenv("OMP_NUM_THREADS", "1", 1);
  baseline();
  const fs::path out = test_data().root / "preemption_twice";
  const int status = signal_run_after(out, " --save-every 10", 25, {SIGTERM, SIGINT});
  ASSERT_TRUE(WIFEXITED(status)) << read_text(out.string() + ".log");
  // Both signals are pending together; whichever is handled second ends the process.
  EXPECT_TRUE(WEXITSTATUS(status) == 128 + SIGINT || WEXITSTATUS(status) == 128 + SIGTERM) << WEXITSTATUS(status);
  expect_resume_matches(out, baseline());
}

// Under mpirun the stop is collective: one rank signalled, both stop after the same step and
// checkpoint, mpirun exits 0, and two ranks resume into their uninterrupted run bitwise.
TEST(Preemption, OneSignalledRankStopsEveryRankAfterTheSameStep) {
  const std::string launcher = mpirun_launcher(2);
  const fs::path uninterrupted = test_data().root / "preemption_mpi_baseline", out = test_data().root / "preemption_mpi";
  fs::remove_all(uninterrupted);
  const CommandResult whole = run_shell("OMP_NUM_THREADS=1 " + launcher + " " + TRILLION_BINARY + " train " +
                                        tiny_run_flags(uninterrupted) + " --steps " + std::to_string(kSteps) + " 2>&1");
  ASSERT_EQ(whole.status, 0) << whole.output;
  const int status = signal_run_after(out, "", 20, {SIGTERM}, launcher);
  const std::string log = read_text(out.string() + ".log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(log.find("another rank was signalled"), std::string::npos) << "rank 0 was not the one signalled: " << log;
  const size_t steps_done = metric_lines(out);
  EXPECT_LT(steps_done, size_t(kSteps));
  EXPECT_EQ(read_text(out / "latest"), checkpoint_name(int64_t(steps_done)) + "\n");
  expect_resume_matches(out, uninterrupted, launcher);
}

}  // namespace
}  // namespace trillion::train_test
