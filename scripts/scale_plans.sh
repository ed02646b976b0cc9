#!/usr/bin/env bash
# The planner's numbers in docs/scale.md: `trillion plan` on configs/models/kimi_k3_like.json for the
# seed's case (LoRA of rank 16 on the frozen bf16 base) and its variations, each plan's text under a
# header line: the busiest device's memory by part, its bytes sent, FLOPs and the roofline's step
# time. The devices' rates are stated below. About 8 s a plan on 2 cores (a --longest-sequence
# search up to ten minutes, on 1024 devices).
# Usage: scripts/scale_plans.sh [build/trillion] > plans.txt
set -euo pipefail
trillion=${1:-build/trillion}
config=configs/models/kimi_k3_like.json
lora=(--lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj
      --lora-target-parameters gate_up_proj,down_proj)
# A device of ~1 PFLOP/s dense bf16 sustaining 40 %, NVLink-class links within a node of 8, a
# 400 Gb/s NIC per device between nodes, PCIe 5 x16 to the host.
rates=(--device-flops 400T --intra-bandwidth 450G --inter-bandwidth 50G --host-bandwidth 50G --node-size 8)

plan() {  # devices ep micro-batch seq-len [flags: policy, LoRA]
  local devices=$1 ep=$2 micro=$3 seq=$4
  shift 4
  local flags="$*" kind="full fine-tuning"
  local policy="${flags%%--lora-rank*}"
  policy="${policy% }"
  [[ $flags == *--lora-rank* ]] && kind="LoRA"
  echo "## $kind, $devices devices, ep $ep, $micro x $seq tokens per device, ${policy:-keep-all}"
  "$trillion" plan --config "$config" --devices "$devices" --ep "$ep" --micro-batch "$micro" --seq-len "$seq" \
    --precision bf16 --sharded-checkpoints --threads 2 "${rates[@]}" "$@" | tail -n +2
}

policies=("" "--recompute full" "--swap full" "--recompute full --swap attn_input")
# The seed's case and the largest sequence per device that fits, per policy.
for seq in 1024 2048 4096 8192; do
  for policy in "${policies[@]}"; do
    # shellcheck disable=SC2086
    plan 128 64 1 "$seq" $policy "${lora[@]}"
  done
done
# Other mesh sizes with EP64, and full fine-tuning, at 4096 tokens with full recompute.
for devices in 64 256 512; do plan "$devices" 64 1 4096 --recompute full "${lora[@]}"; done
for devices in 128 256 512 1024; do plan "$devices" 64 1 4096 --recompute full; done
# How many devices full fine-tuning needs: its state shrinks with them, the activations swap out.
for devices in 512 1024; do plan "$devices" 64 1 4096 --swap full; done
# The all-to-all's long tail: the busiest ep slice's experts receiving more of the rows.
for imbalance in 1.0 1.5 2 4; do plan 128 64 1 4096 --recompute full --expert-imbalance "$imbalance" "${lora[@]}"; done
# Long sequences (docs/scale.md, "A million tokens"): the longest sequence whose step fits a device
# of 128 GiB with the activations swapped out, whole on each device and split over cp devices.
longest() {  # devices ep cp [flags: policy]
  local devices=$1 ep=$2 cp=$3
  shift 3
  echo "## the longest sequence, LoRA, $devices devices, ep $ep, cp $cp, 128 GiB a device, $*"
  "$trillion" plan --config "$config" --devices "$devices" --ep "$ep" --cp "$cp" --micro-batch 1 \
    --longest-sequence --device-memory 128G --precision bf16 --sharded-checkpoints --threads 2 "${rates[@]}" \
    "$@" "${lora[@]}" | tail -n +2
}
for cp in 1 2; do longest 128 64 "$cp" --swap full; done
for cp in 1 4 16; do longest 128 8 "$cp" --swap full; done
longest 1024 64 16 --swap full
longest 512 8 64 --swap full  # a million tokens: the config's max_position_embeddings
