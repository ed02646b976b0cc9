// Learning-rate schedule of a training run: linear warmup from 0 to the peak rate over `warmup`
// steps, then cosine decay to min_lr_ratio · peak at the run's last step (`total_steps`, the
// `--steps` of `trillion train`); constant at the minimum beyond it. Steps are 1-based optimizer
// steps; the schedule is a pure function of the step, so a resumed run continues it exactly.
#pragma once

#include <cstdint>

namespace trillion {

struct LrSchedule {
  double peak_lr = 3e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup = 0;
  int64_t total_steps = 1;

  // Learning rate of optimizer step `step` (1-based).
  double at(int64_t step) const;
};

}  // namespace trillion
