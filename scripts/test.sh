#!/usr/bin/env bash
# Sets up (packages + build) and runs the whole test suite with CTest, then the parsers' fuzz targets
# and the suite built with ASan + UBSan (docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$(date +%s)
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
echo "tests: finished in $(($(date +%s) - start)) s" >&2
start=$(date +%s)
bash scripts/fuzz.sh  # the parsers' fuzz targets: a fixed number of executions each, under ASan + UBSan
echo "fuzz targets: built and run in $(($(date +%s) - start)) s" >&2
start=$(date +%s)
# The suite again, built with ASan + UBSan, without its slowest tests (tools/sanitizers/asan_quick_skip.txt)
bash scripts/sanitize.sh address --quick
echo "sanitizers: built and run in $(($(date +%s) - start)) s" >&2
