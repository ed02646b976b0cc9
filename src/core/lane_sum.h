// A sum in double over eight interleaved lanes: term j goes into lane j mod 8 and the lanes are
// added in a fixed tree, so the loop vectorizes (no reassociation needed) and the order, hence the
// bits, depend on n alone (not on the thread count or the instruction set).
#pragma once

#include <cstdint>

namespace trillion {

template <class Term>
double lane_sum(int64_t n, const Term& term) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += term(j + l);
  for (; j < n; ++j) lane[j % 8] += term(j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace trillion
