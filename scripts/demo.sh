#!/usr/bin/env bash
# The demo: set up, build, tokenize the default corpus (Debian's fortune cookie files) with a
# vocabulary of 8192, train configs/models/demo.json from random initialization, evaluate it
# against the unigram baseline of the same split, and generate text. Prints each part's time.
# Environment: STEPS (default 1400), OUT (default runs/demo), DATA (default data/fortunes-8192),
# CONFIG (default configs/models/demo.json; configs/models/demo_moe.json is the MoE demo, same recipe).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=${STEPS:-1400}
out=${OUT:-runs/demo}
data=${DATA:-data/fortunes-8192}
config=${CONFIG:-configs/models/demo.json}

t0=$(date +%s)
bash scripts/setup.sh --target trillion
t1=$(date +%s)

if [ ! -f "$data/val.bin" ]; then
  mapfile -t corpus < <(bash scripts/corpus.sh)
  build/trillion tokenize --input "${corpus[@]}" --out "$data" --vocab-size 8192 --seed 1
fi
t2=$(date +%s)

rm -rf "$out"
build/trillion train --config "$config" --data "$data" --out "$out" \
  --steps "$steps" --batch 16 --seq-len 128 --lr 3e-3 --warmup 60 --seed 1 --eval-every 200 --eval-batches 16 --log-every 50
t3=$(date +%s)

build/trillion eval --checkpoint "$out" --data "$data"
build/trillion generate --checkpoint "$out" --prompt "The meaning of life is" --max-new-tokens 60 \
  --temperature 0.8 --top-p 0.95 --seed 1
t4=$(date +%s)

echo "demo: setup + build $((t1 - t0)) s, tokenize $((t2 - t1)) s, train $((t3 - t2)) s, eval + generate $((t4 - t3)) s" >&2
