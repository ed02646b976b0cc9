// The phase clock (core/phase_clock.h): every thread-second between start and stop lands in one
// phase or in idle, scopes nest (innermost wins) in serial code and inside parallel regions, a team
// scope counts the whole team, and a stopped clock counts nothing.
#include "core/phase_clock.h"

#include <gtest/gtest.h>

#include <chrono>

#include "core/parallel.h"
#include "ops/finite_diff.h"

namespace trillion {
namespace {

void busy_for(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

double accounted(const PhaseTimes& t) {
  double sum = t.idle;
  for (double s : t.seconds) sum += s;
  return sum;
}

double of(const PhaseTimes& t, Phase p) { return t.seconds[static_cast<int>(p)]; }

TEST(PhaseClock, EveryThreadSecondIsInOnePhaseOrIdle) {
  test::with_threads(2, [] {
    PhaseClock::start();
    {
      PhaseScope loss(Phase::loss);
      busy_for(0.01);  // serial: the main thread in loss, the other thread idle
      {
        PhaseScope gemm(Phase::gemm, /*team_scope=*/true);
        busy_for(0.01);  // the whole team in gemm
      }
      parallel_for(2, [](int64_t i) {
        PhaseScope moe(Phase::moe);
        busy_for(0.005);
        PhaseScope gemm(Phase::gemm);  // innermost wins, on each thread
        busy_for(i == 0 ? 0.005 : 0.015);
      });
    }
    const PhaseTimes t = PhaseClock::stop();
    EXPECT_EQ(t.threads, 2);
    EXPECT_NEAR(accounted(t), 2 * t.wall, 1e-3 * t.wall);
    // Lower bounds only: on a loaded machine a thread may be preempted inside a busy wait.
    EXPECT_GE(of(t, Phase::loss), 0.01);
    EXPECT_GE(of(t, Phase::gemm), 2 * 0.01 + 0.005 + 0.015);  // the team scope, then each thread's own
    EXPECT_GE(of(t, Phase::moe), 2 * 0.005);
    EXPECT_GE(t.idle, 0.01);  // the other thread while the main one is in loss
    EXPECT_EQ(of(t, Phase::optimizer), 0.0);
    EXPECT_FALSE(PhaseClock::running());
  });
}

TEST(PhaseClock, StoppedClockCountsNothing) {
  PhaseClock::start();
  const PhaseTimes empty = PhaseClock::stop();
  {
    PhaseScope scope(Phase::gemm, true);
    parallel_for(4, [](int64_t) { busy_for(0.001); });
  }
  PhaseClock::start();
  const PhaseTimes t = PhaseClock::stop();
  EXPECT_LT(accounted(t), 1e-3);
  EXPECT_LT(accounted(empty), 1e-3);
}

}  // namespace
}  // namespace trillion
