#!/usr/bin/env bash
# The seed's validation reproduced on its own architecture at demo scale (docs/validation.md, "The
# seed's validation on k3_mini"), from a fresh machine:
#   (a) pretraining: configs/models/k3_mini.json from random initialization on corpus A (the default
#       corpus, Debian's fortune cookies), in DeepSeek-V3.2's two stages (attention dense while the
#       indexer learns from it, then over its top-k) with aux-loss-free expert balancing: the
#       README's demo (scripts/demo.sh), whose recipe this is;
#   (b) LoRA fine-tuning of that model, its frozen base in bf16, on corpus B (Debian's
#       dict-vera, computing acronyms, as text: scripts/chat_corpus.sh --text, encoded with A's tokenizer):
#       once in one process and once under mpirun -np 4 --ep 4 (FSDP + expert parallelism);
#   (c) for comparison, a full fine-tune of the same steps on B.
# Then each model is evaluated against the unigram and bigram baselines of its corpus's split, the
# indexer's recall of dense attention is measured on A's validation windows, and the numbers, the
# must-show checks, the curves (gnuplot) and the checkpoints' hashes are written: OUT/summary.json,
# OUT/hashes.txt, and with DOCS set the marked section of DOCS/validation.md and DOCS/k3_mini_*.png
# (scripts/validate_report.sh). Same machine, thread count and build: the hashes and the results
# repeat bit for bit. Exits 1 when a check fails, after writing everything.
# Environment: OUT (default runs/validate), DOCS (default docs; empty: write no docs), STEPS and
# DENSE_STEPS (the pretraining's, scripts/demo.sh's defaults), TUNE_STEPS (300).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-runs/validate}
docs=${DOCS-docs}
tune_steps=${TUNE_STEPS:-300}
config=configs/models/k3_mini.json
corpus_a=data/fortunes-8192  # the demo's
corpus_b=data/vera-text
lora=(--lora-rank 16 --lora-alpha 32
  --lora-targets q_proj,k_proj,v_proj,o_proj,q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj)
tune=(--data "$corpus_b" --steps "$tune_steps" --batch 16 --seq-len 128 --lr 6e-3 --warmup 20 --seed 1
  --eval-every 25 --eval-batches 16 --log-every 50 --precision bf16)
ranks=(mpirun --oversubscribe --allow-run-as-root -np 4 -x OMP_NUM_THREADS=1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

start=$(date +%s)
stage() { echo "validate: $1 ($(($(date +%s) - start)) s)" >&2; }
eval_json() { build/trillion eval "$@" | tail -n 1; }
rm -rf "$out"
mkdir -p "$out"

stage "(a) pretraining on $corpus_a: the README's demo (scripts/demo.sh: set-up, corpus A, training, eval)"
OUT="$out/pretrain" DATA="$corpus_a" CONFIG="$config" bash scripts/demo.sh > "$out/demo.log"
eval_json --checkpoint "$out/pretrain" --data "$corpus_a" --indexer-recall > "$out/pretrain_recall.json"
if [ ! -f "$corpus_b/val.bin" ]; then
  mkdir -p "$corpus_b"
  bash scripts/chat_corpus.sh --text > "$corpus_b/vera.txt"
  build/trillion tokenize --input "$corpus_b/vera.txt" --out "$corpus_b" --tokenizer "$corpus_a/tokenizer.model" --seed 1
fi
eval_json --checkpoint "$out/pretrain" --data "$corpus_b" --seq-len 128 > "$out/base_eval.json"

stage "(b) LoRA on $corpus_b, one process"
build/trillion info --json --config "$config" "${lora[@]}" > "$out/lora_info.json"
build/trillion train --init "$out/pretrain" --out "$out/lora" "${tune[@]}" "${lora[@]}"
stage "(b) LoRA on $corpus_b, 4 ranks, FSDP + EP 4"
"${ranks[@]}" build/trillion train --init "$out/pretrain" --out "$out/lora_ep4" "${tune[@]}" "${lora[@]}" --ep 4
stage "(c) full fine-tuning on $corpus_b"
build/trillion train --init "$out/pretrain" --out "$out/full" "${tune[@]}"
for run in lora lora_ep4 full; do eval_json --checkpoint "$out/$run" --data "$corpus_b" > "$out/${run}_eval.json"; done
build/trillion generate --checkpoint "$out/lora" --max-new-tokens 40 --temperature 0 --prompt "CPU:" > "$out/lora_sample.txt"

stage "summary"
# Each run's last checkpoint: its weights (with LoRA, the base and the adapter) and optimizer state.
(cd "$out" && for run in pretrain lora lora_ep4 full; do
  find "$run/$(cat "$run/latest")" -name '*.safetensors' | LC_ALL=C sort | xargs -r sha256sum
done) > "$out/hashes.txt"
bash scripts/validate_report.sh "$out" "$(($(date +%s) - start))" "$docs"
