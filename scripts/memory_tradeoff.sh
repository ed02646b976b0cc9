#!/usr/bin/env bash
# The memory trade-off of the activation policies on one model: for keep-all, selective and full
# recompute, selective and full swap, trains STEPS steps (default 12) of CONFIG (default the MoE
# demo, batch 16 x 128) and prints, from step 3 on, the median tokens/s, the fast tier's peak bytes
# (MemoryStats) and the dry run's planned peak, the peak resident memory (VmHWM, reset each step),
# and what the store did in the last step. Then the budget run: --memory-budget set to keep-all's
# measured peak minus half its activation bytes. Last, keep-all and swap full on DEEP (default
# configs/models/demo_moe_deep.json: the MoE demo with 12 layers), where more of the layers are out
# at once. Every run's loss is printed too: the policies must not change it.
# Environment: CONFIG, DEEP, DATA (default data/fortunes-8192, made by scripts/demo.sh), STEPS, THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${CONFIG:-configs/models/demo_moe.json}
deep=${DEEP:-configs/models/demo_moe_deep.json}
data=${DATA:-data/fortunes-8192}
steps=${STEPS:-12}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run NAME CONFIG FLAGS...: trains, then prints the table row; a keep-all row also writes $out/keep.json.
run() {
  local name=$1 model=$2
  shift 2
  rm -rf "$out/run"
  OMP_NUM_THREADS=${THREADS:-2} build/trillion train --config "$model" --data "$data" --out "$out/run" \
    --steps "$steps" --batch 16 --seq-len 128 --lr 3e-3 --seed 1 --log-every 1000 --mfu-gemm-size 256 \
    --swap-dir "$out" "$@" 2>/dev/null
  python3 - "$out" "$name" <<'PY'
import json, os, statistics, sys
out, name = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(os.path.join(out, "run", "metrics.jsonl"))][2:]
rate = statistics.median(r["tokens_per_s"] for r in rows)
peak = max(r["peak_bytes"] for r in rows)
rss = max(r["peak_rss_bytes"] for r in rows)
m = rows[-1]["memory"]
keep_path = os.path.join(out, "keep.json")
if name.startswith("keep-all"):
    json.dump({"rate": rate, "peak": peak, "rss": rss, "saved": m["saved_bytes"]}, open(keep_path, "w"))
keep = json.load(open(keep_path))
mib = lambda b: f"{b / 2**20:.1f}"
label = name if name != "budget" else f"budget {mib(m['budget_bytes'])} MiB: {m['policy']}"
print(f"| {label} | {rate:.0f} | {keep['rate'] / rate:.2f} | {mib(peak)} | {mib(m['planned_peak_bytes'])} "
      f"({m['planned_peak_bytes'] / peak - 1:+.1%}) | {mib(rss)} ({mib(rss - keep['rss'])}) | {mib(m['saved_bytes'])} | "
      f"{mib(m['recompute_dropped_bytes'])} | {mib(m['swapped_out_bytes'])} | {mib(m['swap_read_bytes'])} | "
      f"{m['swap_wait_s']:.3f} | {rows[-1]['loss']:.6f} |")
PY
}

echo "| policy | tokens/s | time vs keep | fast peak MiB | planned MiB | peak RSS MiB (vs keep) | saved MiB | dropped MiB | swapped MiB | read back MiB | swap wait s | loss |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
run keep-all "$config"
run "recompute selective" "$config" --recompute selective
run "recompute full" "$config" --recompute full
run "swap selective" "$config" --swap selective
run "swap full" "$config" --swap full
budget=$(python3 -c "import json; k = json.load(open('$out/keep.json')); print(k['peak'] - k['saved'] // 2)")
run budget "$config" --memory-budget "$budget"
run "keep-all, 12 layers" "$deep"
run "swap full, 12 layers" "$deep" --swap full
