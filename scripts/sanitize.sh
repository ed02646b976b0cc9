#!/usr/bin/env bash
# The test suite built with sanitizers (CMake's TRILLION_SANITIZE, docs/reliability.md):
#   bash scripts/sanitize.sh [address]   AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/,
#                                        then the whole suite; any report fails its test
#   bash scripts/sanitize.sh address --quick   the same without the slowest tests
#                                        (tools/sanitizers/asan_quick_skip.txt): the CI stage
#   bash scripts/sanitize.sh thread      ThreadSanitizer into build-tsan/, then the tests whose code
#                                        runs threads of its own (tools/sanitizers/tsan_tests.txt:
#                                        the swap engine and its prefetch, signals, crash points)
# OpenMPI's (and its libraries') allocations kept until exit are suppressed by
# tools/sanitizers/lsan.supp (and its lock order in TSan by tsan.supp); mpirun's ranks inherit the
# sanitizer settings.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
quick=${2:-}
if [ -n "$quick" ] && { [ "$quick" != --quick ] || [ "$kind" != address ]; }; then
  echo "sanitize.sh: expected [address [--quick]] or thread, got: $*" >&2
  exit 2
fi
dir=build-asan
[ "$kind" = thread ] && dir=build-tsan
# -O1 with line tables only (-g1): half the build time of -O2 -g, and still full stacks with lines.
start=$(date +%s)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DTRILLION_SANITIZE="$kind" >/dev/null
cmake --build "$dir" -j"$(nproc)"
echo "sanitize ($kind): built in $(($(date +%s) - start)) s" >&2
# The slow unwinder gives leak reports full stacks (OpenMPI's libraries lack frame pointers), so the
# suppressions can match them by library; OpenMPI keeps its components loaded so their frames resolve.
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:check_initialization_order=1
export LSAN_OPTIONS=suppressions=$PWD/tools/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/sanitizers/tsan.supp
export OMPI_MCA_mca_base_component_disable_dlclose=1  # mpirun's local ranks inherit this environment
start=$(date +%s)
if [ "$kind" = thread ]; then
  # Two OpenMP threads: libgomp is not instrumented, but every region announces its fork and join
  # to TSan (core/parallel.h), so races between a region's threads are found, not its own barriers.
  export OMP_NUM_THREADS=2
  ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 1800 -R "$(cat tools/sanitizers/tsan_tests.txt)"
elif [ -n "$quick" ]; then
  skip=$(grep -v -e '^#' -e '^$' tools/sanitizers/asan_quick_skip.txt | paste -sd'|')
  ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 1800 -E "$skip"
else
  ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 1800
fi
echo "sanitize ($kind): suite finished in $(($(date +%s) - start)) s" >&2
