#!/usr/bin/env bash
# The demo: set up, build, tokenize the default corpus (Debian's fortune cookie files) with a
# vocabulary of 8192, train configs/models/k3_mini.json (Kimi Delta Attention 3 : 1 MLA with the
# lightning indexer, 64 small routed experts with sigmoid routing and a shared expert) from random
# initialization, evaluate it against the unigram and bigram baselines of the same split, and
# generate text (OUT/eval.txt, OUT/sample.txt). Prints each part's time.
#
# Sparse attention models train in DeepSeek-V3.2's two stages in one run: attention stays dense for
# the first DENSE_STEPS while the indexers learn from it (their KL loss; the rest of the model trains
# too, from random weights), then the run resumes with attention over the indexers' top-k. Sigmoid
# routers balance their experts without an auxiliary loss (--moe-bias-rate).
# Environment: STEPS (default 1200), DENSE_STEPS (default 300), OUT (default runs/demo), DATA
# (default data/fortunes-8192), CONFIG (default configs/models/k3_mini.json; configs/models/demo.json
# is the dense Qwen3 demo, configs/models/demo_moe.json the softmax-routed MoE demo, same recipe).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=${STEPS:-1200}
dense_steps=${DENSE_STEPS:-300}
out=${OUT:-runs/demo}
data=${DATA:-data/fortunes-8192}
config=${CONFIG:-configs/models/k3_mini.json}

t0=$(date +%s)
bash scripts/setup.sh --target trillion
t1=$(date +%s)

if [ ! -f "$data/val.bin" ]; then
  mapfile -t corpus < <(bash scripts/corpus.sh)
  build/trillion tokenize --input "${corpus[@]}" --out "$data" --vocab-size 8192 --seed 1
fi
t2=$(date +%s)

# The config's layer and router kinds (`trillion info`) decide the stages, the windows and the balancing.
info=$(build/trillion info --config "$config" --json)
sparse_layers=$(jq '.sparse_layers' <<<"$info")
bias_rate=$(jq -r 'if .router == "sigmoid" then "1e-2" else "0" end' <<<"$info")
windows=(--batch 16 --seq-len 128)
[ "$sparse_layers" -eq 0 ] || windows=(--batch 8 --seq-len 256)  # the indexer's top-k well below the window
rm -rf "$out"
reports=(--eval-every 200 --eval-batches 16 --log-every 50)  # not part of a run's saved settings
recipe=(--config "$config" --data "$data" --out "$out" --steps "$steps" "${windows[@]}" --lr 3e-3 --warmup 60
  --seed 1 --moe-bias-rate "$bias_rate" "${reports[@]}")
if [ "$sparse_layers" -eq 0 ]; then
  dense_steps=0
  build/trillion train "${recipe[@]}"
elif [ "$dense_steps" -ge "$steps" ]; then  # dense throughout
  dense_steps=$steps
  build/trillion train "${recipe[@]}" --indexer-mode dense
elif [ "$dense_steps" -le 0 ]; then  # sparse from the start
  dense_steps=0
  build/trillion train "${recipe[@]}" --indexer-mode sparse
else
  build/trillion train "${recipe[@]}" --indexer-mode dense --stop-after "$dense_steps"
  build/trillion train --resume "$out" --indexer-mode sparse "${reports[@]}"
fi
echo "{\"steps\": $steps, \"dense_steps\": $dense_steps}" > "$out/stages.json"  # for scripts/validate.sh
t3=$(date +%s)

build/trillion eval --checkpoint "$out" --data "$data" | tee "$out/eval.txt"
build/trillion generate --checkpoint "$out" --prompt "The meaning of life is" --max-new-tokens 60 \
  --temperature 0.8 --top-p 0.95 --seed 1 | tee "$out/sample.txt"
t4=$(date +%s)

echo "demo: setup + build $((t1 - t0)) s, tokenize $((t2 - t1)) s, train $((t3 - t2)) s, eval + generate $((t4 - t3)) s" >&2
