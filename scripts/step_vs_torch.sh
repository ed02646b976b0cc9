#!/usr/bin/env bash
# The engine's training step against PyTorch eager on the same configs, measured side by side in
# one session with alternating runs: for each CONFIG, ROUNDS rounds (default 2) of `trillion bench
# step` then tools/ref/bench_step_torch.py, batch 16 x 128, THREADS threads (default 2), and a table
# row with the best tokens/s of each and their ratio. Needs the reference venv (tools/ref/requirements.txt)
# at VENV (default /work/venv-ref). Environment: CONFIGS (default the dense and the MoE demo), ROUNDS,
# THREADS, STEPS (default 10), VENV, COMPILE=1 to add torch.compile runs.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${CONFIGS:-"configs/models/demo.json configs/models/demo_moe.json"}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
steps=${STEPS:-10}
python=${VENV:-/work/venv-ref}/bin/python
echo "| config | engine tokens/s (MFU) | torch eager tokens/s | engine / eager |$([ "${COMPILE:-0}" = 1 ] && echo ' torch.compile tokens/s | engine / compile |')"
echo "|---|---|---|---|$([ "${COMPILE:-0}" = 1 ] && echo '---|---|')"
for config in $configs; do
  best_engine=0 best_mfu=0 best_eager=0 best_compile=0
  for _ in $(seq "$rounds"); do
    engine=$(OMP_NUM_THREADS=$threads build/trillion bench step --json --config "$config" --batch 16 --seq-len 128 \
      --steps "$steps" 2>/dev/null)
    eager=$(OMP_NUM_THREADS=$threads "$python" tools/ref/bench_step_torch.py --config "$config" --batch 16 \
      --seq-len 128 --threads "$threads" --steps "$steps" 2>/dev/null)
    read -r best_engine best_mfu < <(python3 -c "import json,sys; e=json.loads(sys.argv[1]); b=float(sys.argv[2]);
print(*(max(b, e['tokens_per_s']), e['mfu']) if e['tokens_per_s'] > b else (b, sys.argv[3]))" "$engine" "$best_engine" "$best_mfu")
    best_eager=$(python3 -c "import json,sys; print(max(float(sys.argv[2]), json.loads(sys.argv[1])['tokens_per_s']))" "$eager" "$best_eager")
    if [ "${COMPILE:-0}" = 1 ]; then
      compiled=$(OMP_NUM_THREADS=$threads "$python" tools/ref/bench_step_torch.py --config "$config" --batch 16 \
        --seq-len 128 --threads "$threads" --steps "$steps" --compile 2>/dev/null)
      best_compile=$(python3 -c "import json,sys; print(max(float(sys.argv[2]), json.loads(sys.argv[1])['tokens_per_s']))" "$compiled" "$best_compile")
    fi
  done
  python3 -c "import sys; e, m, t, c = map(float, sys.argv[2:6]); row = f'| {sys.argv[1]} | {e:.0f} ({m:.2f}) | {t:.0f} | {e / t:.2f} |'
print(row + (f' {c:.0f} | {e / c:.2f} |' if c > 0 else ''))" "$config" "$best_engine" "$best_mfu" "$best_eager" "$best_compile"
done
