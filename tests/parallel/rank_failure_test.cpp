// A rank that dies or stops mid-run ends the whole job with a message naming it, within 60 s:
// SIGKILL (mpirun notices the death), SIGSTOP (the others' collectives time out after
// --collective-timeout, ping every rank and name the one that stays silent). Never a hang.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

// The pid of the process whose command line holds `marker` and whose environment says it is MPI
// rank `rank`; 0 if there is none (yet).
pid_t find_rank(const std::string& marker, int rank) {
  const std::string wanted = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = read_text(entry.path() / "cmdline");
    if (cmdline.find(marker) == std::string::npos || cmdline.find("mpirun") != std::string::npos) continue;
    const std::string environ = read_text(entry.path() / "environ");
    size_t at = 0;
    for (size_t end; (end = environ.find('\0', at)) != std::string::npos; at = end + 1) {
      if (environ.compare(at, end - at, wanted) == 0) return static_cast<pid_t>(std::stoi(name));
    }
  }
  return 0;
}

// Starts a long 2-rank run, waits until it trains, sends `signal` to rank 1 and returns the job's
// output and the seconds from the signal to the job's end.
std::pair<CommandResult, double> signal_rank_one(int signal, const std::string& name) {
  const fs::path out = test_data().root / name;
  fs::remove_all(out);
  const TestData& d = test_data();
  const std::string command = "OMP_NUM_THREADS=1 timeout 180 " + mpirun_launcher(2) + " " + TRILLION_BINARY +
                              " train --config " + d.config_path.string() + " --data " + d.data_dir.string() +
                              " --out " + out.string() + " --steps 1000000 --batch 2 --seq-len 16 --log-every 1000" +
                              kSmallMfuGemm + " --collective-timeout 5 2>&1";
  std::future<CommandResult> job = std::async(std::launch::async, [&] { return run_shell(command); });
  pid_t rank_one = 0;
  for (int i = 0; i < 600 && (rank_one == 0 || !fs::exists(out / "metrics.jsonl")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (rank_one == 0) rank_one = find_rank(out.string(), 1);
  }
  EXPECT_NE(rank_one, 0) << "rank 1 of the job not found";
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl")) << "the job never trained a step";
  const auto signalled = std::chrono::steady_clock::now();
  if (rank_one != 0) kill(rank_one, signal);
  const CommandResult result = job.get();
  return {result, std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count()};
}

TEST(RankFailure, AKilledRankEndsTheJobNamingIt) {
  const auto [result, seconds] = signal_rank_one(SIGKILL, "killed_rank");
  EXPECT_NE(result.status, 0);
  EXPECT_LT(seconds, 60.0);
  EXPECT_NE(result.output.find("rank 1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("signal 9"), std::string::npos) << result.output;
}

TEST(RankFailure, AStoppedRankIsNamedAfterTheCollectiveTimeout) {
  const auto [result, seconds] = signal_rank_one(SIGSTOP, "stopped_rank");
  EXPECT_NE(result.status, 0);
  EXPECT_LT(seconds, 60.0);
  EXPECT_GE(seconds, 5.0) << "not before the timeout";
  EXPECT_NE(result.output.find("did not complete within --collective-timeout 5 s; rank 1 did not answer a ping"),
            std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace trillion::train_test
