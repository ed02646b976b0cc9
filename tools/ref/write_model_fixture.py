#!/usr/bin/env python3
"""Writes model parity fixtures from the Hugging Face transformers modelling code, so that
tests/model/parity_test.cpp checks our C++ model (loss, logits, every parameter gradient) against
transformers without needing Python.

Environment (the versions the committed fixtures were written with):
    torch 2.5.1 (PyPI wheel, 2.5.1+cu124, run on CPU), transformers 4.57.6, safetensors 0.8.0, Python 3.11 (Debian 12).
    Debian 12's python3-torch is 1.13, which transformers >= 4.51 (Qwen3) and >= 4.57 (Qwen3-Next)
    refuse ("PyTorch >= 2.1 is required"), hence torch from PyPI:
        /usr/bin/python3 -m venv /work/venv-ref
        /work/venv-ref/bin/pip install torch==2.5.1 transformers==4.57.6 safetensors==0.8.0
        /work/venv-ref/bin/python tools/ref/write_model_fixture.py   # from the repository root

For each config (configs/models/tiny.json: qwen3, the same with tie_word_embeddings true, and
tiny_qwen3_next.json: qwen3_next with every layer full_attention) it builds Qwen3ForCausalLM / Qwen3NextForCausalLM in float64 with random weights
(torch seed below; every parameter random, the zero-initialised zero-centred norm weights included),
runs random tokens [batch 2, seq 7] and computes the loss with OUR convention:
    loss = mean over targets != -100 of cross_entropy(logits[b, t], targets[b, t])
(targets are given explicitly and not shifted; HF's own loss shifts labels, so it is not used; one
target is -100). It writes tests/fixtures/models/<name>/:
    config.json        the repository config, byte for byte (the tied variant: with the change)
    model.safetensors  every parameter under its HF name, F64 (lm_head.weight absent when tied)
    fixture.safetensors
        tokens  F64 [2, 7]      token ids (safetensors dtypes we read have no integers; exact in F64)
        targets F64 [2, 7]      target ids, -100 = ignored
        logits  F64 [2, 7, V]
        loss    F64 []          mean CE over the 13 counted targets
        grad.<param name> F64   d loss / d parameter, for every parameter in model.safetensors

HF settings: attn_implementation "eager", use_cache False, attention_dropout 0 (model.eval() too),
rope_theta / partial_rotary_factor / rms_norm_eps / head_dim from the config; for qwen3_next also
num_experts 0 (HF's Qwen3NextConfig defaults to 512 experts, our schema to 0), which makes every
layer's MLP the dense Qwen3NextMLP of width intermediate_size (mlp_only_layers is then irrelevant).

Float64 faithfulness: in 4.57.6 the RMSNorms, the rotary tables and the eager softmax compute in
float32 even in a float64 model (x.to(torch.float32), inv_freq built in float32, softmax(dtype=
torch.float32)), which would limit the reference to ~1e-7. The script replaces exactly those four
functions by the same formulas without the float32 casts (see FLOAT64 PATCHES below) and checks that
the patched model agrees with the unpatched one to float32 accuracy (so the patches change rounding
only, not the math).
"""
import json
import os

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_next import modeling_qwen3_next

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SEED = 1234
BATCH, SEQ = 2, 7
IGNORE = -100


# ---- FLOAT64 PATCHES: HF's formulas with the float32 casts removed ------------------------------

def rmsnorm_forward(self, hidden_states):  # Qwen3RMSNorm: weight · x / sqrt(mean(x²) + eps)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def zero_centred_rmsnorm_forward(self, x):  # Qwen3NextRMSNorm: x / sqrt(mean(x²) + eps) · (1 + weight)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * (1.0 + self.weight)


def rotary_forward(self, x, position_ids):  # cos, sin of position · inv_freq, in x's dtype
    inv_freq = self.inv_freq[None, :, None].to(x.dtype).expand(position_ids.shape[0], -1, 1)
    freqs = (inv_freq @ position_ids[:, None, :].to(x.dtype)).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def float64_inv_freq(config):  # _compute_default_rope_parameters in float64
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def make_eager_attention(module_globals):  # eager_attention_forward with the softmax in query's dtype
    repeat_kv = module_globals.repeat_kv

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
        return attn_output, attn_weights

    return eager_attention_forward


ORIGINALS = {
    (modeling_qwen3.Qwen3RMSNorm, "forward"): modeling_qwen3.Qwen3RMSNorm.forward,
    (modeling_qwen3_next.Qwen3NextRMSNorm, "forward"): modeling_qwen3_next.Qwen3NextRMSNorm.forward,
    (modeling_qwen3.Qwen3RotaryEmbedding, "forward"): modeling_qwen3.Qwen3RotaryEmbedding.forward,
    (modeling_qwen3_next.Qwen3NextRotaryEmbedding, "forward"): modeling_qwen3_next.Qwen3NextRotaryEmbedding.forward,
    (modeling_qwen3, "eager_attention_forward"): modeling_qwen3.eager_attention_forward,
    (modeling_qwen3_next, "eager_attention_forward"): modeling_qwen3_next.eager_attention_forward,
}
PATCHES = {
    (modeling_qwen3.Qwen3RMSNorm, "forward"): rmsnorm_forward,
    (modeling_qwen3_next.Qwen3NextRMSNorm, "forward"): zero_centred_rmsnorm_forward,
    (modeling_qwen3.Qwen3RotaryEmbedding, "forward"): rotary_forward,
    (modeling_qwen3_next.Qwen3NextRotaryEmbedding, "forward"): rotary_forward,
    (modeling_qwen3, "eager_attention_forward"): make_eager_attention(modeling_qwen3),
    (modeling_qwen3_next, "eager_attention_forward"): make_eager_attention(modeling_qwen3_next),
}


def set_patches(table):
    for (owner, name), value in table.items():
        setattr(owner, name, value)


# ---- model, data, fixture ---------------------------------------------------------------------

def hf_config(ours):
    fields = {k: v for k, v in ours.items() if k != "model_type"}
    common = dict(attn_implementation="eager", use_cache=False, attention_dropout=0.0, hidden_act="silu")
    if ours["model_type"] == "qwen3":
        return Qwen3ForCausalLM, Qwen3Config(**fields, **common)
    if ours["model_type"] == "qwen3_next":
        assert all(t == "full_attention" for t in ours["layer_types"]), "only full_attention layers are built"
        return Qwen3NextForCausalLM, Qwen3NextConfig(**fields, **common, num_experts=0, mlp_only_layers=[])
    raise ValueError(f"model_type {ours['model_type']} has no reference here")


def randomize(model, generator):
    """Every parameter random: projections N(0, 1/fan_in) so activations stay O(1), embeddings N(0, 1),
    norm weights 1 + N(0, 0.1²) (plain) or N(0, 0.1²) (zero-centred), so every term is exercised."""
    zero_centred = isinstance(model, Qwen3NextForCausalLM)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_((0.0 if zero_centred else 1.0) + 0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)


def our_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def run(model_class, config, state, tokens, targets):
    model = model_class(config).double().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied: aliases embed
    for module in model.modules():
        if hasattr(module, "inv_freq"):
            module.inv_freq = float64_inv_freq(config)
    logits = model(input_ids=tokens, use_cache=False).logits
    loss = our_loss(logits, targets)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return model, logits.detach(), loss.detach(), grads


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def write_fixture(config_name, fixture_name, changes=None):
    config_path = os.path.join(ROOT, "configs", "models", config_name)
    with open(config_path, "rb") as f:
        config_bytes = f.read()
    ours = json.loads(config_bytes)
    if changes:  # a variant of a repository config
        ours.update(changes)
        config_bytes = (json.dumps(ours, indent=2) + "\n").encode()
    model_class, config = hf_config(ours)
    generator = torch.Generator().manual_seed(SEED)

    torch.manual_seed(SEED)
    model = model_class(config).double()
    randomize(model, generator)
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    V = ours["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=generator)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=generator)
    targets[1, 3] = IGNORE

    set_patches(ORIGINALS)  # HF as shipped (float32 norms, rotary tables, softmax)
    _, logits32, loss32, _ = run(model_class, config, state, tokens, targets)
    set_patches(PATCHES)
    model, logits, loss, grads = run(model_class, config, state, tokens, targets)
    drift = max(rel_err(logits, logits32), rel_err(loss, loss32))
    assert drift < 1e-5, f"float64 patches change the model beyond float32 rounding: {drift}"

    out_dir = os.path.join(ROOT, "tests", "fixtures", "models", fixture_name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "wb") as f:
        f.write(config_bytes)
    names = [name for name, _ in model.named_parameters()]  # tied lm_head.weight is not listed
    save_file({name: state[name].contiguous() for name in names}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    fixture = {
        "tokens": tokens.double(),
        "targets": targets.double(),
        "logits": logits.contiguous(),
        "loss": loss.reshape(()),
    }
    fixture.update({f"grad.{name}": grads[name].contiguous() for name in names})
    save_file(fixture, os.path.join(out_dir, "fixture.safetensors"),
              metadata={"producer": f"tools/ref/write_model_fixture.py: {model_class.__name__}, seed {SEED}, "
                                    f"torch {torch.__version__}, transformers {transformers.__version__}"})
    # (one metadata key: safetensors orders several at random, and reruns should give identical bytes)
    print(f"{fixture_name}: loss {loss.item():.17g}, {len(names)} parameters, "
          f"float32-vs-float64 HF drift {drift:.2e}")


if __name__ == "__main__":
    write_fixture("tiny.json", "tiny_qwen3")
    write_fixture("tiny_qwen3_next.json", "tiny_qwen3_next")
    write_fixture("tiny.json", "tiny_qwen3_tied", {"tie_word_embeddings": True})
