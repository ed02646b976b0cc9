#!/usr/bin/env bash
# The parsers' libFuzzer targets (fuzz/, docs/reliability.md), built with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer into build-fuzz/.
#   bash scripts/fuzz.sh              build, then the short runs (a fixed number of executions each,
#                                     from the seed corpora) through CTest, as the test suite does
#   bash scripts/fuzz.sh --long [N]   build, then N executions of each target (default 1000000),
#                                     printing executions, coverage and findings per target
# Needs the packages scripts/setup.sh installs (clang, libclang-rt-14-dev for libFuzzer, libomp-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DTRILLION_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)"
if [ "${1:-}" != "--long" ]; then
  ctest --test-dir build-fuzz --output-on-failure -j"$(nproc)"
  exit 0
fi
runs=${2:-1000000}
mkdir -p build-fuzz/long
for source in fuzz/*_fuzz.cpp; do  # every target (fuzz/CMakeLists.txt builds one per file)
  target=$(basename "$source" _fuzz.cpp)
  corpus=build-fuzz/fuzz/corpus/$target
  log=build-fuzz/long/$target.log
  start=$(date +%s)
  status=0
  (cd build-fuzz/long && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     ../fuzz/${target}_fuzz -runs="$runs" -seed=1 -max_len=8192 -timeout=10 -print_final_stats=1 \
     "../../$corpus" "../../fuzz/corpus/$target" >"$target.log" 2>&1) || status=$?
  executed=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  coverage=$(grep -E '^#[0-9]+.*cov:' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+).*/\1 edges, \2 features/')
  echo "$target: exit $status, ${executed:-?} executions in $(($(date +%s) - start)) s, coverage ${coverage:-?}," \
       "corpus $(ls "$corpus" | wc -l) inputs; log $log"
done
