// OpenMP's idle threads sleep at once rather than spin. libgomp's default spins about 300,000
// times at every fork and barrier; a spinning thread that shares a core with a busy process takes
// time from the thread doing the work. A whole-model gradient check ran 5–7× slower with one core
// taken, and 1.2–1.6× with sleeping threads (docs/architecture.md, "Parallel regions").
//
// libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main: it offers no call to change
// the policy, and a value set from the executable's .preinit_array is not taken up either. So the
// `trillion` executable, when the environment chooses no policy (neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT is set), sets OMP_WAIT_POLICY=passive and executes itself again, once, before
// anything else. Under valgrind it does not (valgrind would not follow the new image).
#pragma once

namespace trillion {

// Returns only when the policy is the environment's own or cannot be set (exec failed); otherwise
// the process continues as a fresh image of /proc/self/exe with the same arguments.
void ensure_openmp_wait_policy(char** argv);

}  // namespace trillion
