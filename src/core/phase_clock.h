// The phase clock: where a training step's time goes, measured by the engine's own clocks on every
// thread of the OpenMP team (trillion bench step).
//
// Time is counted in thread-seconds: between start() and stop() each of the team's N threads is, at
// every moment, in exactly one phase or idle, so the phases plus idle add up to N × the wall time.
//   - Serial code (the main thread outside parallel regions) is in the phase of its innermost
//     PhaseScope; the other N − 1 threads are idle then, except inside a GEMM that OpenBLAS runs
//     on the whole team (a gemm outside parallel regions: team_scope), which is all GEMM.
//   - Inside a parallel region (parallel_region / parallel_for, core/parallel.h) every thread keeps
//     its own phase: it starts in the phase the region was opened in, nested scopes switch it (a
//     single-threaded GEMM inside an expert's item is GEMM), and the time from its fork to its
//     first instruction and from its last one to the join is idle (its wait at the barrier).
// Scopes cost two clock reads; with the clock stopped they cost a branch.
#pragma once

#include <array>
#include <cstdint>

namespace trillion {

enum class Phase : int {
  gemm,       // matrix products (cblas), dense and grouped
  attention,  // the mixers' own kernels: attention, sparse attention, indexer, delta rule, conv, gates
  moe,        // routing, permute, combine, the experts' SwiGLU (their GEMMs are gemm)
  elementwise,  // norms, RoPE, activations, residual adds, embedding, copies
  loss,       // the LM head's cross-entropy outside its GEMMs
  optimizer,  // gradient norm, clipping, AdamW
  other,      // everything else (the store's events, the trainer)
  count_
};
constexpr int kNumPhases = static_cast<int>(Phase::count_);
const char* phase_name(Phase phase);

struct PhaseTimes {
  std::array<double, kNumPhases> seconds{};  // thread-seconds per phase
  double idle = 0.0;                          // thread-seconds idle
  int threads = 1;                            // N
  double wall = 0.0;                          // seconds from start() to stop()
};

class PhaseClock {
 public:
  // Starts counting on the main thread (outside parallel regions), in phase `other`.
  static void start();
  // Stops and returns the times since start().
  static PhaseTimes stop();
  static bool running();
};

// Switches the calling thread to `phase` until the scope ends. team_scope: a serial call that runs
// on the whole team (a multithreaded BLAS call), so every thread's time is `phase`.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase, bool team_scope = false);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  bool active_ = false;
  bool in_region_ = false;  // switched a team thread's phase inside a region (else the serial one)
  Phase previous_ = Phase::other;
  bool previous_team_ = false;
};

// The region protocol core/parallel.h follows: the main thread calls region_begin() before the
// fork and region_end() after the join; every team thread calls thread_enter() first and
// thread_leave() last. All are no-ops unless timed (the clock runs and the region is not nested).
struct RegionClock {
  bool timed = false;
  double fork_time = 0.0;
  Phase phase = Phase::other;
  void region_begin();
  void thread_enter() const;
  void thread_leave() const;
  void region_end();
};

}  // namespace trillion
