#!/usr/bin/env python3
"""Writes transformers' default configs of the MoE families we build, and the parameter counts of the
models they describe, so that the engine's config parser and parameter counting are checked against
the library without Python.

Environment: torch 2.15.0 (PyPI, 2.15.0+cu132, CPU), transformers 5.24.0, safetensors 0.8.0
(tools/ref/requirements.txt). Rerun, from the repository root:
    /work/venv-ref/bin/python tools/ref/write_default_configs.py
    /work/venv-ref/bin/python tools/ref/write_default_configs.py param_counts_mla.json   # one counts file

Writes
    configs/models/qwen3_moe_default.json  Qwen3MoeConfig().save_pretrained(...)'s config.json, byte for byte
    configs/models/glm4_moe_default.json   Glm4MoeConfig().save_pretrained(...)'s config.json, byte for byte
    configs/models/qwen3_next_default.json Qwen3NextConfig().save_pretrained(...)'s config.json, byte for byte
    tests/fixtures/param_counts.json       {"<name>": {"config": <path>, "num_parameters": N}} for
        qwen3_moe_default and glm4_moe_default, N from
        `with torch.device("meta"): AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))`
        then model.num_parameters() (lm_head counted: neither default ties embeddings; buffers such as
        e_score_correction_bias are not parameters; glm4_moe's MTP layer is not built by transformers).
    tests/fixtures/param_counts_linear_attention.json  the same for qwen3_next_default (Gated DeltaNet
        layers 3 of every 4; qwen3_next's MTP layer is not built either; A_log, dt_bias are parameters).
    configs/models/deepseek_v3_default.json   DeepseekV3Config().save_pretrained(...)'s config.json, byte for byte
    configs/models/deepseek_v32_default.json  DeepseekV32Config().save_pretrained(...)'s config.json
    configs/models/kimi_linear_default.json   KimiLinearConfig().save_pretrained(...)'s config.json (as the
        library constructs it: pad_token_id 163839 and its attribute_map names, e.g. num_experts,
        moe_renormalize, model_max_length)
    tests/fixtures/param_counts_mla.json  the same for the MLA families: deepseek_v3_default,
        deepseek_v32_default (the lightning indexer's wq_b, wk, k_norm, weights_proj are parameters, though
        transformers gives them no gradient), kimi_linear_default (KDA + NoPE MLA + MoE). No MTP layer is built.
It also prints the parameters active per token (own formula, not written): every parameter except the
routed experts, plus num_experts_per_tok of the routed experts of each MoE layer.
"""
import json
import os
import shutil
import tempfile

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, DeepseekV3Config, DeepseekV32Config, Glm4MoeConfig,
                          KimiLinearConfig, Qwen3MoeConfig, Qwen3NextConfig)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# counts file (under tests/fixtures/) -> {name: config class}; a separate file for the linear-attention
# families, so that param_counts.json (and its test) stays as it is
DEFAULTS = {
    "param_counts.json": {"qwen3_moe_default": Qwen3MoeConfig, "glm4_moe_default": Glm4MoeConfig},
    "param_counts_linear_attention.json": {"qwen3_next_default": Qwen3NextConfig},
    "param_counts_mla.json": {"deepseek_v3_default": DeepseekV3Config, "deepseek_v32_default": DeepseekV32Config,
                              "kimi_linear_default": KimiLinearConfig},
}


def routed_expert_params(model):
    """(total routed expert parameters, per MoE layer: (E, parameters of one expert))."""
    total, layers = 0, []
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            total += p.numel()
            if name.endswith("gate_up_proj"):
                layers.append(p.shape[0])
    return total, layers


def main(files=None):
    """files: counts file names (keys of DEFAULTS) to write; all of them by default."""
    for counts_file, defaults in DEFAULTS.items():
        if files and counts_file not in files:
            continue
        write_counts(counts_file, defaults)


def write_counts(counts_file, defaults):
    counts = {}
    for name, config_class in defaults.items():
        rel = f"configs/models/{name}.json"
        with tempfile.TemporaryDirectory() as tmp:
            config_class().save_pretrained(tmp)
            shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(ROOT, rel))
        config = AutoConfig.from_pretrained(os.path.join(ROOT, rel))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        n = model.num_parameters()
        counts[name] = {"config": rel, "num_parameters": n}
        routed, layers = routed_expert_params(model)
        k = config.num_experts_per_tok
        active = n - routed + sum(routed // len(layers) * k // E for E in layers)
        embed = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
        print(f"{name}: {type(model).__name__} {n} parameters ({n / 1e9:.2f}B); routed experts {routed} in "
              f"{len(layers)} MoE layers; active per token {active} ({active / 1e9:.2f}B), "
              f"{active - embed} ({(active - embed) / 1e9:.2f}B) without embed_tokens + lm_head")
    path = os.path.join(ROOT, "tests", "fixtures", counts_file)
    with open(path, "w") as f:
        json.dump(counts, f, indent=2)
        f.write("\n")
    print(json.dumps(counts, indent=2))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
