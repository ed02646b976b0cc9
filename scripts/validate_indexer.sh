#!/usr/bin/env bash
# DeepSeek-V3.2's two indexer stages on configs/models/demo_mla.json (4 sparse MLA layers, indexer
# 4 heads of 32, top-128 of up to 1024 keys) over the default corpus, as docs/validation.md reports:
#   1. pretrain with dense attention, the indexer untrained (its loss off);
#   2. dense warm-up from that checkpoint: only the indexers learn (KL against the main attention);
#   3. from the warm-up checkpoint, a sparse continuation (attention over the top-k, every tensor
#      learns, the indexer over the selected set) and a dense continuation, same steps and seed.
# Environment: OUT (default runs/indexer), DATA (default data/fortunes-8192), PRETRAIN / WARMUP /
# CONTINUE steps (defaults 400 / 150 / 150).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-runs/indexer}
data=${DATA:-data/fortunes-8192}
pretrain=${PRETRAIN:-400}
warmup=${WARMUP:-150}
continue_steps=${CONTINUE:-150}
config=configs/models/demo_mla.json
common=(--data "$data" --batch 4 --seq-len 1024 --seed 1 --eval-every 50 --eval-batches 8 --log-every 25)

bash scripts/setup.sh --target trillion
if [ ! -f "$data/val.bin" ]; then
  mapfile -t corpus < <(bash scripts/corpus.sh)
  build/trillion tokenize --input "${corpus[@]}" --out "$data" --vocab-size 8192 --seed 1
fi
rm -rf "$out"
build/trillion train --config "$config" --out "$out/pretrain" --steps "$pretrain" --lr 3e-3 \
  --indexer-mode dense --indexer-loss-coef 0 "${common[@]}"
build/trillion train --init "$out/pretrain" --out "$out/warmup" --steps "$warmup" --lr 3e-3 --warmup 10 \
  --indexer-mode warmup --indexer-loss-coef 1 "${common[@]}"
for mode in sparse dense; do
  build/trillion train --init "$out/warmup" --out "$out/$mode" --steps "$continue_steps" --lr 1e-3 --warmup 10 \
    --indexer-mode "$mode" --indexer-loss-coef 1 "${common[@]}"
done
