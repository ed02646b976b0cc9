// Linear warmup + cosine decay (see lr_schedule.h).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trillion {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step <= warmup) return peak_lr * static_cast<double>(step) / static_cast<double>(warmup);
  const double min_lr = peak_lr * min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup);
  const double progress = std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace trillion
