// The test executable's entry point: OpenMP's idle threads sleep, as in `trillion` (core/openmp_wait.h),
// then GoogleTest.
#include <gtest/gtest.h>

#include "core/openmp_wait.h"

int main(int argc, char** argv) {
  trillion::ensure_openmp_wait_policy(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
