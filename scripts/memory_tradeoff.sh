#!/usr/bin/env bash
# The memory trade-off of the activation policies on one model: for keep-all, selective and full
# recompute, selective and full swap, trains STEPS steps (default 12) of CONFIG (default the MoE
# demo, batch 16 x 128) and prints, from steps 3 on, the median tokens/s, the fast tier's peak
# bytes, the peak resident memory (VmHWM, reset each step), and what the store did in the last
# step. Every run's loss is printed too: the policies must not change it.
# Environment: CONFIG, DATA (default data/fortunes-8192, made by scripts/demo.sh), STEPS, THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${CONFIG:-configs/models/demo_moe.json}
data=${DATA:-data/fortunes-8192}
steps=${STEPS:-12}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| policy | tokens/s | time vs keep | fast peak MiB | peak RSS MiB | saved MiB | dropped MiB | swapped MiB | read back MiB | swap wait s | loss |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
keep_rate=""
for policy in "none none" "selective none" "full none" "none selective" "none full"; do
  set -- $policy
  rm -rf "$out/run"
  OMP_NUM_THREADS=${THREADS:-2} build/trillion train --config "$config" --data "$data" --out "$out/run" \
    --steps "$steps" --batch 16 --seq-len 128 --lr 3e-3 --seed 1 --log-every 1000 --mfu-gemm-size 256 \
    --recompute "$1" --swap "$2" --swap-dir "$out" 2>/dev/null
  keep_rate=$(python3 - "$out/run/metrics.jsonl" "$1" "$2" "$keep_rate" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])][2:]
rate = statistics.median(r["tokens_per_s"] for r in rows)
keep = float(sys.argv[4]) if sys.argv[4] else rate
m = rows[-1]["memory"]
mib = lambda b: f"{b / 2**20:.0f}"
name = "keep-all" if sys.argv[2] == sys.argv[3] == "none" else (
    f"recompute {sys.argv[2]}" if sys.argv[3] == "none" else f"swap {sys.argv[3]}")
print(f"| {name} | {rate:.0f} | {keep / rate:.2f} | {mib(max(r['peak_bytes'] for r in rows))} | "
      f"{mib(max(r['peak_rss_bytes'] for r in rows))} | {mib(m['saved_bytes'])} | {mib(m['recompute_dropped_bytes'])} | "
      f"{mib(m['swapped_out_bytes'])} | {mib(m['swap_read_bytes'])} | {m['swap_wait_s']:.3f} | {rows[-1]['loss']:.6f} |",
      file=sys.stderr)
print(keep)
PY
  )
done 2>&1
