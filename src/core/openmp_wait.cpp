// OMP_WAIT_POLICY=passive by executing the program again. See openmp_wait.h.
#include "core/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace trillion {
namespace {

bool under_valgrind() {
  const char* preload = std::getenv("LD_PRELOAD");
  return preload != nullptr && std::strstr(preload, "vgpreload") != nullptr;
}

}  // namespace

void ensure_openmp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr || under_valgrind())
    return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");  // exec failed: go on with libgomp's default, as loaded
}

}  // namespace trillion
