#!/usr/bin/env bash
# LoRA fine-tuning on ChatML conversations from the pretrained MoE demo (docs/validation.md, "LoRA
# on conversations"): tokenize the default corpus with a tokenizer that holds ChatML's markers,
# pretrain configs/models/demo_moe.json on it (the MoE demo's recipe), turn Debian's acronym
# dictionary into conversations (scripts/chat_corpus.sh) encoded with the same tokenizer, evaluate
# the pretrained model's masked loss on their validation split (assistant turns only), and train
# rank-8 pairs on attention and the routed experts from it, the validation loss every 25 steps.
# Environment: RUNS (default runs), PRETRAIN_STEPS (1400), LORA_STEPS (300).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-runs}
pretrain_steps=${PRETRAIN_STEPS:-1400}
lora_steps=${LORA_STEPS:-300}
text=data/fortunes-chat-8192
chat=data/vera-chat

bash scripts/setup.sh --target trillion
if [ ! -f "$text/val.bin" ]; then
  mapfile -t corpus < <(bash scripts/corpus.sh)
  build/trillion tokenize --input "${corpus[@]}" --out "$text" --vocab-size 8192 --seed 1 --chat-markers
fi
if [ ! -f "$chat/val.bin" ]; then
  mkdir -p "$chat"
  bash scripts/chat_corpus.sh > "$chat/conversations.jsonl"
  build/trillion tokenize --input "$chat/conversations.jsonl" --out "$chat" --tokenizer "$text/tokenizer.model" --seed 1
fi

base="$runs/demo_moe_chat"
if [ ! -f "$base/latest" ]; then
  build/trillion train --config configs/models/demo_moe.json --data "$text" --out "$base" --steps "$pretrain_steps" \
    --batch 16 --seq-len 128 --lr 3e-3 --warmup 60 --seed 1 --eval-every 200 --eval-batches 16 --log-every 50
fi
echo "the pretrained model on the conversations' validation split (assistant turns):" >&2
build/trillion eval --checkpoint "$base" --data "$chat" --batch 16

lora="$runs/vera_lora"
rm -rf "$lora"
build/trillion train --init "$base" --data "$chat" --out "$lora" --steps "$lora_steps" --batch 16 --seq-len 128 \
  --lr 6e-3 --warmup 20 --seed 1 --eval-every 25 --eval-batches 16 --log-every 25 \
  --lora-rank 8 --lora-alpha 16 --lora-targets q_proj,k_proj,v_proj,o_proj --lora-target-parameters gate_up_proj,down_proj
build/trillion generate --checkpoint "$lora" --prompt $'<|im_start|>user\nWhat does CPU stand for?<|im_end|>\n<|im_start|>assistant\n' \
  --max-new-tokens 24 --temperature 0
