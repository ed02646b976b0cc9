#!/usr/bin/env python3
"""The other direction of LoRA parity: an adapter the engine trained, loaded by the peft package onto the
engine's checkpoint with transformers, evaluated on the same validation windows as `trillion eval`. Its
loss must be the engine's (docs/validation.md, "An adapter the engine trained, read by PEFT").

Environment: tools/ref/requirements.txt (torch 2.15.0, transformers 5.24.0, peft 0.21.2). From the
repository root, after a LoRA run (float64 for a 1e-10 comparison):
    build/trillion train --config configs/models/demo_moe.json --data data/fortunes-8192 --out OUT \\
        --steps 3 --batch 4 --seq-len 64 --dtype float64 --lora-rank 4 --lora-targets q_proj,o_proj \\
        --lora-target-parameters gate_up_proj,down_proj
    build/trillion eval --checkpoint OUT --data data/fortunes-8192 --seq-len 64 --batch 4 --max-batches 2
    /work/venv-ref/bin/python tools/ref/peft_eval_adapter.py --checkpoint OUT/checkpoint-000003 \\
        --adapter OUT/adapter --data data/fortunes-8192 --seq-len 64 --batch 4 --max-batches 2
It prints one JSON line: PEFT's val_loss over the windows, their target count, and the adapter's keys.

The windows are eval's (src/data/sampler.cpp eval_window): the val split's token streams (one per shard)
cut into seq_len windows, window w reading tokens w * seq_len .. + seq_len (0 past the end) with the next
token as its target (ignored past the end, or where the shard marks it as not a target). The model runs
in float64 with hf_fp64's float32 sites recompiled, as the parity fixtures.
"""
import argparse
import json
import os
import struct

import numpy as np
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import hf_fp64

NOT_TARGET = 1 << 31
IGNORE = -100


def read_shard(path):
    with open(path, "rb") as f:
        header = f.read(64)
        assert header[:8] == b"TRLNTOK\0", f"{path}: not a token shard"
        (token_count,) = struct.unpack_from("<Q", header, 24)
        return np.frombuffer(f.read(4 * token_count), dtype="<u4")


def val_streams(data_dir):
    index = os.path.join(data_dir, "val.index.json")
    if not os.path.exists(index):
        return [read_shard(os.path.join(data_dir, "val.bin"))]
    with open(index) as f:
        return [read_shard(os.path.join(data_dir, s["file"])) for s in json.load(f)["shards"]]


def windows(streams, seq_len):
    for stream in streams:
        count = len(stream)
        for w in range(0 if count <= 1 else (count - 1 + seq_len - 1) // seq_len):
            inputs, targets = [], []
            for t in range(seq_len):
                i = w * seq_len + t
                inputs.append(int(stream[i]) & ~NOT_TARGET if i < count else 0)
                has_next = i + 1 < count and not (int(stream[i + 1]) & NOT_TARGET)
                targets.append(int(stream[i + 1]) if has_next else IGNORE)
            yield inputs, targets


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the engine's checkpoint directory (the frozen base)")
    parser.add_argument("--adapter", required=True, help="the engine's adapter directory (PEFT's files)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--max-batches", type=int, default=0)
    args = parser.parse_args()

    with open(os.path.join(args.checkpoint, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    hf_fp64.apply(model_type, "loss")
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float64, experts_implementation="eager",
                                                 attn_implementation="eager").to(torch.float64)
    model = PeftModel.from_pretrained(model, args.adapter).eval()
    keys = sorted(load_file(os.path.join(args.adapter, "adapter_model.safetensors")))
    all_windows = list(windows(val_streams(args.data), args.seq_len))
    batches = [all_windows[i:i + args.batch] for i in range(0, len(all_windows), args.batch)]
    if args.max_batches:
        batches = batches[:args.max_batches]
    loss_sum, count = 0.0, 0
    for batch in batches:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([inputs for inputs, _ in batch]), use_cache=False).logits
        target = torch.tensor([targets for _, targets in batch]).reshape(-1)
        loss_sum += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target,
                                                     ignore_index=IGNORE, reduction="sum").item()
        count += int((target != IGNORE).sum())
    print(json.dumps({"val_loss": loss_sum / count, "targets": count, "batches": len(batches), "adapter_keys": len(keys),
                      "expert_keys": [k for k in keys if ".experts." in k][:4]}))


if __name__ == "__main__":
    main()
