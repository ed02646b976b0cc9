// Parallel loops (core/parallel.h) and turns (core/turns.h): a loop below the work threshold runs on
// the calling thread, above it on the team; turns order a dynamic loop's steps by item even when a
// waiter must sleep; and the executables run with OpenMP's idle threads sleeping
// (core/openmp_wait.h) unless the environment chooses.
#include "core/parallel.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/turns.h"
#include "ops/finite_diff.h"
#include "test_support/command.h"

namespace trillion {
namespace {

// How many items of a loop ran inside a parallel region.
template <class Loop>
int64_t items_in_a_region(int64_t n, const Loop& loop) {
  std::atomic<int64_t> inside{0};
  std::vector<int> seen(n, 0);
  loop([&](int64_t i) {
    inside += omp_in_parallel() ? 1 : 0;
    ++seen[i];
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << i;
  return inside.load();
}

TEST(ParallelFor, BelowTheWorkThresholdTheCallingThreadRunsTheLoop) {
  test::with_threads(2, [&] {
    const int64_t n = 64, small = kMinParallelWork / n - 1, large = kMinParallelWork / n;
    EXPECT_EQ(items_in_a_region(n, [&](auto body) { parallel_for(n, small, body); }), 0);
    EXPECT_EQ(items_in_a_region(n, [&](auto body) { parallel_for_dynamic(n, small, body); }), 0);
    EXPECT_EQ(items_in_a_region(1, [&](auto body) { parallel_for(1, kMinParallelWork, body); }), 0);
    EXPECT_EQ(items_in_a_region(n, [&](auto body) { parallel_for(n, large, body); }), n);
    EXPECT_EQ(items_in_a_region(n, [&](auto body) { parallel_for_dynamic(n, large, body); }), n);
    EXPECT_EQ(items_in_a_region(n, [&](auto body) { parallel_for(n, body); }), n);  // no estimate: the team
  });
}

// Items taken dynamically by two threads append in item order; item 3 holds its turn for 30 ms,
// long past the waiters' spin, so they sleep and must be woken.
TEST(Turn, OrdersTheStepsOfADynamicLoopEvenWhenWaitersSleep) {
  test::with_threads(2, [&] {
    const int64_t items = 40;
    Turn turn;
    std::vector<int64_t> order;
    parallel_for_dynamic(items, [&](int64_t item) {
      turn.wait_for(item);
      if (item == 3) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      order.push_back(item);
      turn.pass_to(item + 1);
    });
    ASSERT_EQ(static_cast<int64_t>(order.size()), items);
    for (int64_t i = 0; i < items; ++i) EXPECT_EQ(order[i], i);
  });
}

// `trillion` runs with OMP_WAIT_POLICY=passive (spin count 0) unless the environment sets a policy.
TEST(OpenmpWait, TrillionSleepsIdleThreadsUnlessTheEnvironmentChooses) {
  const std::string info = std::string(" OMP_DISPLAY_ENV=verbose ") + TRILLION_BINARY + " info --config " +
                           TRILLION_SOURCE_DIR + "/configs/models/tiny.json 2>&1";
  const std::string chosen_by_us = test::run_shell("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT" + info).output;
  // libgomp prints its settings as it loads: the first image's, then the re-executed one's.
  const size_t last = chosen_by_us.rfind("OMP_WAIT_POLICY = ");
  ASSERT_NE(last, std::string::npos) << chosen_by_us;
  EXPECT_EQ(chosen_by_us.substr(last, 27), "OMP_WAIT_POLICY = 'PASSIVE'") << chosen_by_us;
  EXPECT_NE(chosen_by_us.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << chosen_by_us;
  const std::string chosen_by_user = test::run_shell("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active" + info).output;
  EXPECT_NE(chosen_by_user.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << chosen_by_user;
  EXPECT_EQ(chosen_by_user.find("PASSIVE"), std::string::npos) << chosen_by_user;
}

}  // namespace
}  // namespace trillion
