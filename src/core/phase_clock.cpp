// The phase clock's accounting (see the header). The serial state belongs to the main thread; each
// team thread writes only its own slot inside a region, and the main thread reads the slots after
// the join, so no counter is shared while it is written.
#include "core/phase_clock.h"

#include <omp.h>

#include <chrono>
#include <vector>

namespace trillion {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct alignas(64) ThreadSlot {
  std::array<double, kNumPhases> seconds{};
  double idle = 0.0;
  double mark = 0.0;        // when the current phase's segment began
  double leave_time = 0.0;  // when the thread finished its part of the region
  Phase phase = Phase::other;
  bool in_region = false;
  bool entered = false;
};

bool g_running = false;
int g_threads = 1;
double g_start = 0.0;
// Serial code: the main thread's phase, whether the whole team is in it, and since when.
Phase g_phase = Phase::other;
bool g_team = false;
double g_mark = 0.0;
std::array<double, kNumPhases> g_seconds{};
double g_idle = 0.0;
std::vector<ThreadSlot> g_slots;

void charge_serial(double now) {
  const double dt = now - g_mark;
  g_seconds[static_cast<int>(g_phase)] += dt;
  if (g_team) {
    g_seconds[static_cast<int>(g_phase)] += dt * (g_threads - 1);
  } else {
    g_idle += dt * (g_threads - 1);
  }
  g_mark = now;
}

// The calling thread's slot inside a timed region, or null.
ThreadSlot* region_slot() {
  if (omp_get_level() != 1) return nullptr;
  const int t = omp_get_thread_num();
  if (t >= static_cast<int>(g_slots.size()) || !g_slots[t].in_region) return nullptr;
  return &g_slots[t];
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::gemm: return "gemm";
    case Phase::attention: return "attention";
    case Phase::moe: return "moe";
    case Phase::elementwise: return "elementwise";
    case Phase::loss: return "loss";
    case Phase::optimizer: return "optimizer";
    case Phase::other: return "other";
    case Phase::count_: break;
  }
  return "?";
}

void PhaseClock::start() {
  g_threads = omp_get_max_threads();
  g_slots.assign(static_cast<size_t>(g_threads), ThreadSlot{});
  g_seconds.fill(0.0);
  g_idle = 0.0;
  g_phase = Phase::other;
  g_team = false;
  g_start = g_mark = now_s();
  g_running = true;
}

PhaseTimes PhaseClock::stop() {
  const double now = now_s();
  charge_serial(now);
  g_running = false;
  PhaseTimes times;
  times.seconds = g_seconds;
  times.idle = g_idle;
  for (const ThreadSlot& slot : g_slots) {
    for (int p = 0; p < kNumPhases; ++p) times.seconds[p] += slot.seconds[p];
    times.idle += slot.idle;
  }
  times.threads = g_threads;
  times.wall = now - g_start;
  return times;
}

bool PhaseClock::running() { return g_running; }

PhaseScope::PhaseScope(Phase phase, bool team_scope) {
  if (!g_running) return;
  const double now = now_s();
  if (omp_in_parallel()) {
    ThreadSlot* slot = region_slot();
    if (slot == nullptr) return;
    slot->seconds[static_cast<int>(slot->phase)] += now - slot->mark;
    slot->mark = now;
    previous_ = slot->phase;
    slot->phase = phase;
    in_region_ = true;
  } else {
    charge_serial(now);
    previous_ = g_phase;
    previous_team_ = g_team;
    g_phase = phase;
    g_team = team_scope;
  }
  active_ = true;
}

PhaseScope::~PhaseScope() {
  if (!active_ || !g_running) return;
  const double now = now_s();
  if (in_region_) {
    ThreadSlot* slot = region_slot();
    if (slot == nullptr) return;
    slot->seconds[static_cast<int>(slot->phase)] += now - slot->mark;
    slot->mark = now;
    slot->phase = previous_;
  } else {
    charge_serial(now);
    g_phase = previous_;
    g_team = previous_team_;
  }
}

void RegionClock::region_begin() {
  timed = g_running && !omp_in_parallel();
  if (!timed) return;
  fork_time = now_s();
  charge_serial(fork_time);
  phase = g_phase;
}

void RegionClock::thread_enter() const {
  if (!timed) return;
  const int t = omp_get_thread_num();
  if (t >= static_cast<int>(g_slots.size())) return;
  ThreadSlot& slot = g_slots[t];
  const double now = now_s();
  slot.idle += now - fork_time;
  slot.mark = now;
  slot.phase = phase;
  slot.in_region = slot.entered = true;
}

void RegionClock::thread_leave() const {
  if (!timed) return;
  ThreadSlot* slot = region_slot();
  if (slot == nullptr) return;
  const double now = now_s();
  slot->seconds[static_cast<int>(slot->phase)] += now - slot->mark;
  slot->leave_time = now;
  slot->in_region = false;
}

void RegionClock::region_end() {
  if (!timed) return;
  const double now = now_s();
  for (ThreadSlot& slot : g_slots) {  // each thread's wait for the join (or the whole region)
    slot.idle += now - (slot.entered ? slot.leave_time : fork_time);
    slot.entered = false;
  }
  g_mark = now;
}

}  // namespace trillion
