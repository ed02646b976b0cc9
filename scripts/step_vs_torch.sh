#!/usr/bin/env bash
# The engine's training step against PyTorch on the same configs, measured side by side in one
# session with alternating runs: for each CONFIG, ROUNDS rounds (default 2), each running for every
# precision of PRECISIONS (default fp32; bf16 is the engine's --precision bf16 and PyTorch's bf16
# autocast) `trillion bench step`, tools/ref/bench_step_torch.py eager and, with COMPILE=1, under
# torch.compile; batch 16 x 128, THREADS threads (default 2). Prints a table row per config and
# precision with the best tokens/s of each and the engine's ratios, and keeps every run's JSON line
# in RAW (default /dev/null). Needs the reference venv (tools/ref/requirements.txt) at VENV (default
# /work/venv-ref). Environment: CONFIGS (default the dense and the MoE demo), ROUNDS, PRECISIONS,
# THREADS, STEPS (default 10), VENV, COMPILE, RAW.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=${CONFIGS:-"configs/models/demo.json configs/models/demo_moe.json"}
precisions=${PRECISIONS:-fp32}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
steps=${STEPS:-10}
python=${VENV:-/work/venv-ref}/bin/python
raw=${RAW:-/dev/null}
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for config in $configs; do
  for _ in $(seq "$rounds"); do
    for precision in $precisions; do
      OMP_NUM_THREADS=$threads build/trillion bench step --json --config "$config" --batch 16 --seq-len 128 \
        --steps "$steps" --precision "$precision" 2>/dev/null | tail -1 >>"$runs"
      modes="eager"
      [ "${COMPILE:-0}" = 1 ] && modes="eager compile"
      for mode in $modes; do
        OMP_NUM_THREADS=$threads "$python" tools/ref/bench_step_torch.py --config "$config" --batch 16 \
          --seq-len 128 --threads "$threads" --steps "$steps" --precision "$precision" \
          $([ "$mode" = compile ] && echo --compile) 2>/dev/null | tail -1 >>"$runs"
      done
    done
  done
done
cat "$runs" >>"$raw"
python3 - "$runs" <<'EOF'
import json, sys
best = {}  # (config, precision, side) -> the best run's line
for line in open(sys.argv[1]):
    run = json.loads(line)
    side = "engine" if run["bench"] == "step" else run["mode"]
    key = (run["config"], run.get("precision", "fp32"), side)
    if key not in best or run["tokens_per_s"] > best[key]["tokens_per_s"]:
        best[key] = run
print("| config | precision | engine tokens/s (MFU of the GEMM rate, of the physical peak) | torch eager | "
      "engine / eager | torch.compile | engine / compile |")
print("|---|---|---|---|---|---|---|")
for (config, precision, side), engine in best.items():
    if side != "engine":
        continue
    eager, compiled = best.get((config, precision, "eager")), best.get((config, precision, "compile"))
    cells = [config, precision,
             f"{engine['tokens_per_s']:.0f} ({engine['mfu']:.2f}, {engine.get('mfu_peak', 0):.2f})"]
    for peer in (eager, compiled):
        cells += [f"{peer['tokens_per_s']:.0f}", f"**{engine['tokens_per_s'] / peer['tokens_per_s']:.2f}**"] \
            if peer else ["", ""]
    print("| " + " | ".join(cells) + " |")
EOF
