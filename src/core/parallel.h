// Thread parallelism (OpenMP). Kernels split work with parallel_for over independent items and
// keep every reduction inside one item, so results do not depend on the thread count; reductions
// across items go through fixed-order partial sums (deterministic_sum).
//
// A region pays for itself only above some work: its fork and join cost microseconds on a quiet
// machine, and up to a scheduler time slice when another process holds one of the cores (a thread
// of the team waits to be scheduled). Loops that say their work per item (element-wise passes,
// small reductions) run on the calling thread below kMinParallelWork; see docs/architecture.md,
// "Parallel regions". Loops whose items call a GEMM always open a region, so the library runs
// single-threaded inside them whatever the sizes (its multi-threaded products may round
// differently).
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

#include "core/phase_clock.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace trillion {

// ThreadSanitizer cannot see libgomp's own synchronization (Debian's libgomp is not instrumented),
// so in a TSan build (scripts/sanitize.sh thread) each region tells it the two happens-before edges
// a region is: everything before the fork precedes every thread's body, and every body precedes
// what follows the join. Other builds compile these to nothing. One access stays outside the
// edges: the block of shared variables that GCC fills right before the fork and each thread reads
// first; tools/sanitizers/tsan.supp drops the reports whose top frame is parallel_region itself.
inline char g_tsan_fork_token = 0, g_tsan_join_token = 0;
inline void tsan_release(void* token) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(token);
#else
  (void)token;
#endif
}
inline void tsan_acquire(void* token) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(token);
#else
  (void)token;
#endif
}

inline int num_threads() { return omp_get_max_threads(); }


// Runs body() once on every thread of the OpenMP team (omp_get_thread_num() tells them apart),
// timed by the phase clock (core/phase_clock.h). body must not throw.
template <class Body>
void parallel_region(const Body& body) {
  RegionClock clock;
  clock.region_begin();
  tsan_release(&g_tsan_fork_token);
#pragma omp parallel
  {
    tsan_acquire(&g_tsan_fork_token);
    clock.thread_enter();
    body();
    clock.thread_leave();
    tsan_release(&g_tsan_join_token);
  }
  tsan_acquire(&g_tsan_join_token);
  clock.region_end();
}

// Below this many elements touched (about 5–10 µs of one thread's element-wise work) a loop runs on
// the calling thread.
constexpr int64_t kMinParallelWork = 16384;

// Runs body(i) for i in [0, n) on the OpenMP team, static schedule. body must not throw.
template <class Body>
void parallel_for(int64_t n, const Body& body) {
  parallel_region([&] {
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < n; ++i) body(i);
  });
}

// Whether n items of about work_per_item each pay for a region's fork and join.
inline bool worth_a_region(int64_t n, int64_t work_per_item) {
  return n > 1 && n * work_per_item >= kMinParallelWork;
}

// The same for items of about `work_per_item` elements (or multiply-adds) each: on the calling
// thread when the whole loop's work is under kMinParallelWork or there is one item.
template <class Body>
void parallel_for(int64_t n, int64_t work_per_item, const Body& body) {
  if (worth_a_region(n, work_per_item)) return parallel_for(n, body);
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Like parallel_for, for uneven items (dynamic schedule; each item's result is still independent).
template <class Body>
void parallel_for_dynamic(int64_t n, const Body& body) {
  parallel_region([&] {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t i = 0; i < n; ++i) body(i);
  });
}

// The same with a work estimate per item, as parallel_for(n, work_per_item, body).
template <class Body>
void parallel_for_dynamic(int64_t n, int64_t work_per_item, const Body& body) {
  if (worth_a_region(n, work_per_item)) return parallel_for_dynamic(n, body);
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Sum of f(i) for i in [0, n), in double, with a reduction order that is fixed by n alone:
// fixed-size blocks are summed in parallel, then the block sums in order.
template <class F>
double deterministic_sum(int64_t n, const F& f) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  parallel_for(blocks, kBlock, [&](int64_t b) {
    double s = 0.0;
    const int64_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
    for (int64_t i = b * kBlock; i < end; ++i) s += f(i);
    partial[b] = s;
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace trillion
