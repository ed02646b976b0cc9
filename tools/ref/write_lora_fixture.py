#!/usr/bin/env python3
"""Writes PEFT LoRA parity fixtures: an adapter made by the peft package (non-zero B) on a committed
transformers-made model fixture, with PEFT's float64 logits and loss, so that the C++ tests
(tests/model/lora_parity_test.cpp) check that the engine loads PEFT's files and computes what PEFT does,
without needing Python.

Environment: tools/ref/requirements.txt (torch 2.15.0, transformers 5.24.0, peft 0.21.2, safetensors 0.8.0).
Rerun, from the repository root, after tools/ref/write_model_fixture.py has written the base fixtures:
    /work/venv-ref/bin/python tools/ref/write_lora_fixture.py            # every fixture
    /work/venv-ref/bin/python tools/ref/write_lora_fixture.py tiny_qwen3 # some of them
    PYTHONPATH=DIR /work/venv-ref/bin/python tools/ref/write_lora_fixture.py --per-expert
                                       # transformers 4.57.3 in DIR (PER_EXPERT_FIXTURES says how)
Reruns give identical bytes (the script runs itself under PYTHONHASHSEED=0: PEFT keeps target_modules as a
set, whose order it writes).

Each fixture is tests/fixtures/models/<base>/lora/ (lora_per_expert/ for --per-expert):
    adapter_config.json, adapter_model.safetensors   as PeftModel.save_pretrained writes them (F64)
    fixture.safetensors
        logits  F64 [2, 7, V]   PEFT's model on the base fixture's tokens
        lm_loss F64 []          mean cross-entropy over the base fixture's counted targets (hf_fp64.our_ce)

Adapter: LoraConfig with the targets below, r 4 (rank_pattern gives o_proj 2), lora_alpha 8 (alpha_pattern
gives one module 3), modules_to_save lm_head where the base's head is untied; then every lora_A and
lora_B random (N(0, 0.3²), a seeded generator) and the saved module perturbed, so that every adapted
path changes the logits. The float64 patches of hf_fp64 (float32 sites recompiled in float64) stay on.
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

import hf_fp64

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")
SEED = 4321
FIXTURES = {
    # base fixture: (target_modules, alpha_pattern key, modules_to_save)
    "tiny_qwen3": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "layers.1.mlp.up_proj",
                   ["lm_head"]),
    # Gated DeltaNet's and gated attention's projections and the shared expert's gate (not "all-linear": PEFT
    # then also adapts qwen3_next's router, an nn.Linear, and the routed experts)
    "tiny_qwen3_next_hybrid": (["in_proj_qkvz", "in_proj_ba", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                                "shared_expert_gate"], "in_proj_qkvz", ["lm_head"]),
    # MLA's projections
    "tiny_deepseek_v3": (["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"], "kv_b_proj", None),
    # attention and the routed experts: PEFT 0.21 on transformers 5 turns gate_proj / up_proj / down_proj on an MoE
    # model into target_parameters on the fused experts (gate_up_proj at rank 2r and alpha 2 alpha, through
    # rank_pattern and alpha_pattern), PEFT's fused layout; layer 0's dense MLP is then not adapted
    "tiny_qwen3_moe": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                       "layers.1.self_attn.v_proj", ["lm_head"]),
}
# PEFT's per-expert layout (--per-expert): transformers 4 keeps routed experts as a list of modules, and PEFT
# adapts each expert's gate_proj / up_proj / down_proj (and layer 0's dense MLP) as linear layers. Run with
# transformers 4.57.3 first on the path (tools/ref/requirements-transformers4.txt, installed into a directory
# of its own: pip install --target DIR -r tools/ref/requirements-transformers4.txt; then
# PYTHONPATH=DIR /work/venv-ref/bin/python tools/ref/write_lora_fixture.py --per-expert). Written to
# <base>/lora_per_expert/.
PER_EXPERT_FIXTURES = {
    "tiny_qwen3_moe": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                       "layers.1.self_attn.v_proj", ["lm_head"]),
}


def write(name, per_expert=False):
    targets_modules, alpha_key, save = (PER_EXPERT_FIXTURES if per_expert else FIXTURES)[name]
    base_dir = os.path.join(MODELS, name)
    with open(os.path.join(base_dir, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    hf_fp64.restore()
    if per_expert:
        assert transformers.__version__.startswith("4."), f"--per-expert needs transformers 4, not {transformers.__version__}"
        hf_fp64.apply(model_type + "_transformers4", "loss")
        # transformers 5's config names the expert count num_local_experts and RoPE's base in rope_parameters
        config = AutoConfig.from_pretrained(base_dir)
        config.num_experts = config.num_local_experts
        config.rope_theta = config.rope_parameters["rope_theta"]
        model = AutoModelForCausalLM.from_pretrained(base_dir, config=config, torch_dtype=torch.float64,
                                                     attn_implementation="eager").eval()
    else:
        hf_fp64.apply(model_type, "loss")
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64, experts_implementation="eager",
                                                     attn_implementation="eager").eval()
    # from_pretrained keeps some modules in float32 (routers): cast, then take the stored float64 values
    # (the fused layout's in-memory names where the base has experts, under transformers 5).
    model = model.to(torch.float64)
    fused = os.path.isdir(os.path.join(base_dir, "fused")) and not per_expert
    stored = os.path.join(base_dir, "fused" if fused else ".")
    missing, unexpected = model.load_state_dict(load_file(os.path.join(stored, "model.safetensors")), strict=False)
    assert not unexpected and all(m == "lm_head.weight" and model.config.tie_word_embeddings for m in missing), \
        (missing, unexpected)
    fixture = load_file(os.path.join(base_dir, "fixture.safetensors"))
    tokens, targets = fixture["tokens"].long(), fixture["targets"].long()
    with torch.no_grad():
        base_logits = model(input_ids=tokens, use_cache=False).logits
    drift = ((base_logits - fixture["logits"]).abs().max() / fixture["logits"].abs().max()).item()
    assert drift < 1e-13, f"the base fixture reloads with logits {drift} off"
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets_modules, rank_pattern={"o_proj": 2},
                        alpha_pattern={alpha_key: 3}, modules_to_save=save, lora_dropout=0.0, task_type="CAUSAL_LM")
    model.name_or_path = f"tests/fixtures/models/{name}"  # written as base_model_name_or_path
    model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for param_name, param in sorted(model.named_parameters()):
            if ".lora_A." in param_name or ".lora_B." in param_name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator, dtype=torch.float64))
            elif ".modules_to_save." in param_name:
                param.add_(0.05 * torch.randn(param.shape, generator=generator, dtype=torch.float64))
    with torch.no_grad():
        logits = model(input_ids=tokens, use_cache=False).logits
    lm_loss = hf_fp64.our_ce(logits.double(), targets)
    change = ((logits - base_logits).abs().max() / base_logits.abs().max()).item()
    assert change > 1e-3, f"the adapter barely changes the logits ({change})"
    out_dir = os.path.join(base_dir, "lora_per_expert" if per_expert else "lora")
    model.save_pretrained(out_dir)
    for extra in os.listdir(out_dir):
        if extra not in ("adapter_config.json", "adapter_model.safetensors"):
            os.remove(os.path.join(out_dir, extra))
    save_file({"logits": logits.detach().contiguous(), "lm_loss": lm_loss.detach().reshape(())},
              os.path.join(out_dir, "fixture.safetensors"),
              metadata={"producer": f"tools/ref/write_lora_fixture.py: peft {peft.__version__}, torch "
                                    f"{torch.__version__}, transformers {transformers.__version__}, seed {SEED}"})
    for f in os.listdir(out_dir):
        os.chmod(os.path.join(out_dir, f), 0o644)
    saved = load_file(os.path.join(out_dir, "adapter_model.safetensors"))
    print(json.dumps({"name": name, "lm_loss": lm_loss.item(), "logit change": change,
                      "keys": {k: list(v.shape) for k, v in sorted(saved.items())}}, indent=1))


if __name__ == "__main__":
    per_expert_run = "--per-expert" in sys.argv
    names = [a for a in sys.argv[1:] if a != "--per-expert"]
    for n in names or list(PER_EXPERT_FIXTURES if per_expert_run else FIXTURES):
        write(n, per_expert_run)
