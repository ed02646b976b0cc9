// The project's one definition of relative error (docs/architecture.md, "Relative error"), used by
// tests, gradient checks and benchmarks alike: per tensor, max|a − b| / max(max|b|, 1e-30), b being
// the reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace trillion {

// actual[n] against expected[n] (the reference), accumulated in double.
template <class A, class B>
double relative_error(const A* actual, const B* expected, int64_t n) {
  double max_diff = 0.0, max_expected = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(actual[i]) - static_cast<double>(expected[i])));
    max_expected = std::max(max_expected, std::abs(static_cast<double>(expected[i])));
  }
  return max_diff / std::max(max_expected, 1e-30);
}

}  // namespace trillion
