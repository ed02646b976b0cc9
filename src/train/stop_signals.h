// Preemption: a SIGTERM or SIGINT during training asks the run to stop after its current step,
// with a checkpoint, and exit 0 with a line saying how to continue (schedulers such as SLURM send
// SIGTERM before they take the machine back). A second signal ends the process at once, with exit
// status 128 + signal; the last complete checkpoint stays valid (checkpoints are atomic).
//
// Under mpirun the decision is collective: each step's end sums the ranks' flags, so every rank
// stops after the same step once any rank has been signalled.
#pragma once

#include "parallel/process_group.h"

namespace trillion {

// Installs the SIGTERM and SIGINT handlers for its lifetime (restoring the previous ones after).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked this process to stop (0: none yet).
  int received() const;
  // Whether any rank of `world` has been asked to stop (collective: every rank calls it, once per step).
  bool stop_requested(const ProcessGroup& world) const;
};

}  // namespace trillion
