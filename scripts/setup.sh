#!/usr/bin/env bash
# Installs the Debian packages that building, testing and the demo need, then configures and
# builds trillion into build/. Idempotent: packages already installed are not fetched again, and
# the build is incremental. Prints the time of each part.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev            # double GEMM (OpenMP build, so it nests in our parallel regions)
  libdnnl-dev ocl-icd-opencl-dev    # float GEMM at the CPU's width (oneDNN; its CMake config wants OpenCL)
  libxsmm-dev                       # JIT small-matrix kernels (bench tiles: against oneDNN per tile)
  libsentencepiece-dev              # tokenizer training and encoding
  zlib1g-dev libzstd-dev            # .gz and .zst corpus files
  libpcre2-dev libutf8proc-dev      # Hugging Face tokenizers: pre-tokenizer regexes, NFC
  nlohmann-json3-dev libcli11-dev   # config/metrics JSON, command line
  libgtest-dev libgmock-dev         # tests
  libopenmpi-dev openmpi-bin        # distributed runs (mpirun: FSDP, expert parallelism)
  fortunes fortunes-min             # the default corpus: fortune cookie files
  dict-vera                         # the conversations corpus (scripts/chat_corpus.sh): acronyms
  jq gnuplot-nox                    # scripts/validate.sh: its summary and curves
  clang libclang-rt-14-dev libomp-14-dev   # the parsers' libFuzzer targets (scripts/fuzz.sh)
)

start=$(date +%s)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
after_packages=$(date +%s)
echo "setup: packages ready in $((after_packages - start)) s" >&2

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" "$@"
echo "setup: build ready in $(($(date +%s) - after_packages)) s" >&2
