"""PyTorch reference for `trillion bench step`: whole training steps of the same model config with the
transformers library's modelling code, at the same batch, sequence length and thread count.

Written for (tools/ref/requirements.txt): torch 2.15.0 (PyPI wheel, run on CPU), transformers 5.24.0,
Python 3.11. The model is built from the engine's config.json (a Hugging Face config) with random
weights in float32, sdpa attention, use_cache=False, in training mode; the tokens are random, the
labels the inputs (transformers shifts them: the same next-token loss as the engine's). Each step is
forward, backward, gradient clipping to norm 1 and AdamW (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight
decay 0.1: the engine's defaults), fused where torch offers it on CPU, foreach otherwise. --compile
wraps the model in torch.compile (the default inductor backend). --precision bf16 runs the forward
under torch.autocast("cpu", dtype=torch.bfloat16), as a user who wants speed does: matmuls take bf16
operands (oneDNN), the weights and AdamW stay float32, as the engine's --precision bf16. Prints one
JSON line.

  /work/venv-ref/bin/python tools/ref/bench_step_torch.py --config configs/models/demo.json \
      --batch 16 --seq-len 128 --threads 2 [--steps 10] [--warmup 2] [--compile] [--precision bf16]
"""
import argparse
import contextlib
import json
import statistics
import time

import torch
import transformers


def build_model(config_path):
    with open(config_path) as f:
        fields = json.load(f)
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          dtype=torch.float32)
    model.train()
    return model, config


def make_optimizer(model):
    params = [p for p in model.parameters() if p.requires_grad]
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        return torch.optim.AdamW(params, fused=True, **hyper), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=True, **hyper), "foreach"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, config = build_model(args.config)
    optimizer, adamw = make_optimizer(model)
    step_model = torch.compile(model) if args.compile else model
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq_len))

    losses = []

    def forward_precision():
        if args.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step():
        with forward_precision():
            loss = step_model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())

    for _ in range(args.warmup):
        train_step()
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        train_step()
        seconds.append(time.perf_counter() - start)
    step_s = statistics.median(seconds)
    print(json.dumps({"bench": "step_torch", "config": args.config, "model_type": config.model_type,
                      "mode": "compile" if args.compile else "eager", "precision": args.precision, "adamw": adamw,
                      "batch": args.batch, "seq_len": args.seq_len, "threads": torch.get_num_threads(),
                      "steps": args.steps, "warmup": args.warmup, "step_s": step_s, "min_step_s": min(seconds),
                      "tokens_per_s": args.batch * args.seq_len / step_s, "first_loss": losses[0],
                      "last_loss": losses[-1], "torch": torch.__version__,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
