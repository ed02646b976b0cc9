"""Float64-faithful Hugging Face transformers: the shared half of tools/ref/write_model_fixture.py.

Written for (tools/ref/requirements.txt): torch 2.15.0 (PyPI wheel, 2.15.0+cu132, run on CPU),
transformers 5.24.0, safetensors 0.8.0, Python 3.11.

transformers computes parts of a float64 model in float32 (docs/architecture.md, section
"Float32 traps of transformers"): RMSNorm casts to
float32, the RoPE inv_freq table is built in float32 and cos/sin are computed in float32, the routers
compute their softmax / sigmoid logits in float32, eager attention's softmax is float32, the qwen
aux loss accumulates in float32 and ForCausalLMLoss upcasts to float32; the linear attentions (qwen3_next
Gated DeltaNet, kimi_linear KDA) compute their decay gates, gated output norms and whole chunk / recurrent
kernels in float32. Here each of those functions
is RECOMPILED FROM ITS OWN SOURCE with the float32 dtypes replaced by float64
(`torch.float32`, `torch.float` -> `torch.float64`, `.float()` -> `.double()`) and put back on its
class or module (`apply(family)`); `restore()` puts the originals back. The math is unchanged; only the
rounding. `Float32Leaks` is a TorchDispatchMode that records every op producing a float32 (or
half) tensor, so a caller can assert that a patched forward + backward computes in float64 only.

Other helpers: `randomize` (every parameter random, the zero-centred norm offsets and the router's
e_score_correction_bias buffer included), `our_ce` (our loss convention), `aux_loss_fp64` (an
independent float64 re-derivation of transformers' load_balancing_loss_func, pooled over layers),
`routing_margins` (the gaps at every top-k / group selection boundary: ties there would make the
fixture depend on torch's tie order), `capture_indexers` / `indexer_scores_fp64` (DeepSeek-V3.2's lightning
indexer scores, re-derived in float64 from the indexer's inputs, for its top-k boundary check).
Families: qwen3, qwen3_moe, qwen3_next, kimi_linear (KDA + NoPE MLA), glm4_moe, deepseek_v3 (MLA, default
and YaRN RoPE: modeling_rope_utils._compute_yarn_parameters, also replaced in ROPE_INIT_FUNCTIONS),
deepseek_v32 (+ the indexer, still under @torch.no_grad), and loss (ForCausalLMLoss).
"""
import importlib
import inspect
import re
import textwrap
import traceback

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

IGNORE = -100

# YaRN (docs/architecture.md, "Float32 traps of transformers"): _compute_yarn_parameters builds
# inv_freq in float32 (pos_freqs, the linear ramp).
# The rotary modules look it up in the ROPE_INIT_FUNCTIONS dict, so that entry is replaced too ("D[key]"
# paths name a dict item).
ROPE_YARN = ("transformers.modeling_rope_utils", ["_compute_yarn_parameters", "ROPE_INIT_FUNCTIONS[yarn]"])

# family -> (module path, [attribute paths to recompile: "Class.method", "function" or "DICT[key]"]), or a
# list of such pairs (a family whose float32 sites span several modules)
SITES = {
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", [
        "Qwen3RMSNorm.forward",
        "Qwen3RotaryEmbedding.compute_default_rope_parameters",
        "Qwen3RotaryEmbedding.forward",
        "eager_attention_forward",
    ]),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", [
        "Qwen3MoeRMSNorm.forward",
        "Qwen3MoeRotaryEmbedding.compute_default_rope_parameters",
        "Qwen3MoeRotaryEmbedding.forward",
        "Qwen3MoeTopKRouter.forward",
        "eager_attention_forward",
        "load_balancing_loss_func",
    ]),
    # transformers 4.57's qwen3_moe (experts as a list of modules: PEFT's per-expert LoRA layout), for
    # write_lora_fixture.py --per-expert; its default RoPE table comes from modeling_rope_utils, through
    # ROPE_INIT_FUNCTIONS
    "qwen3_moe_transformers4": [
        ("transformers.models.qwen3_moe.modeling_qwen3_moe", [
            "Qwen3MoeRMSNorm.forward",
            "Qwen3MoeRotaryEmbedding.forward",
            "Qwen3MoeSparseMoeBlock.forward",
            "eager_attention_forward",
        ]),
        ("transformers.modeling_rope_utils", ["_compute_default_rope_parameters", "ROPE_INIT_FUNCTIONS[default]"]),
    ],
    # Gated DeltaNet (docs/architecture.md, "Float32 traps of transformers"): the gated norm (fp32 norm
    # and fp32 silu(z)), the decay
    # g = -exp(A_log.float()) * softplus(a.float() + dt_bias) in the layer's forward, and the fp32 casts at
    # the top of both kernels. The kernels are module globals (decorated by use_kernel_func_from_hub_with_
    # fallback, re-applied by the recompile: it binds the torch function again), looked up at call time.
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", [
        "Qwen3NextRMSNorm.forward",
        "Qwen3NextRMSNormGated.forward",
        "Qwen3NextRotaryEmbedding.compute_default_rope_parameters",
        "Qwen3NextRotaryEmbedding.forward",
        "Qwen3NextTopKRouter.forward",
        "Qwen3NextGatedDeltaNet.forward",
        "torch_chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule",
        "eager_attention_forward",
        "load_balancing_loss_func",
    ]),
    # KDA (docs/architecture.md, "Float32 traps of transformers"): both norms, the per-channel forget
    # gate, the router, the fp32 casts of
    # both kernels (the chunk kernel also has `decay_mask ... .exp().float()`), the layer's forward (its
    # only site stores the cached state: use_cache=True only) and eager attention (MLA layers only).
    # No RoPE (kimi's MLA is NoPE) and no aux loss.
    "kimi_linear": ("transformers.models.kimi_linear.modeling_kimi_linear", [
        "KimiLinearRMSNorm.forward",
        "KimiLinearRMSNormGated.forward",
        "KimiLinearForgetGate.forward",
        "KimiLinearTopkRouter.forward",
        "KimiLinearDeltaAttention.forward",
        "chunk_kimi_delta_attention",
        "recurrent_kimi_delta_attention",
        "eager_attention_forward",
    ]),
    # DeepSeek-V3 (docs/architecture.md, "Float32 traps of transformers"): RMSNorm (q_a / kv_a layernorms
    # too), the default RoPE table and its
    # forward, YaRN's table (rope_type "yarn"; its attention_factor and the MLA softmax mscale are Python
    # floats), the sigmoid router (gate weight and e_score_correction_bias are created float32: .to(float64)
    # fixes them) and eager attention. No aux loss.
    "deepseek_v3": [("transformers.models.deepseek_v3.modeling_deepseek_v3", [
        "DeepseekV3RMSNorm.forward",
        "DeepseekV3RotaryEmbedding.compute_default_rope_parameters",
        "DeepseekV3RotaryEmbedding.forward",
        "DeepseekV3TopkRouter.forward",
        "eager_attention_forward",
    ]), ROPE_YARN],
    # DeepSeek-V3.2 (docs/architecture.md, "Float32 traps of transformers"): as deepseek_v3, plus the
    # lightning indexer's `.float()` scores
    # (DeepseekV32Indexer.forward; the rewrite keeps its @torch.no_grad, so the indexer parameters still
    # get no gradient). Its k_norm is an nn.LayerNorm (float64 as is).
    "deepseek_v32": [("transformers.models.deepseek_v32.modeling_deepseek_v32", [
        "DeepseekV32RMSNorm.forward",
        "DeepseekV32RotaryEmbedding.compute_default_rope_parameters",
        "DeepseekV32RotaryEmbedding.forward",
        "DeepseekV32Indexer.forward",
        "DeepseekV32TopkRouter.forward",
        "eager_attention_forward",
    ]), ROPE_YARN],
    "glm4_moe": ("transformers.models.glm4_moe.modeling_glm4_moe", [
        "Glm4MoeRMSNorm.forward",
        "Glm4MoeRotaryEmbedding.compute_default_rope_parameters",
        "Glm4MoeRotaryEmbedding.forward",
        "Glm4MoeTopkRouter.forward",
        "eager_attention_forward",
    ]),
    "loss": ("transformers.loss.loss_utils", ["ForCausalLMLoss"]),
}

_REPLACEMENTS = [
    (re.compile(r"torch\.float32\b"), "torch.float64"),
    (re.compile(r"torch\.float\b"), "torch.float64"),  # \b: not torch.float32 / torch.float64
    (re.compile(r"\.float\(\)"), ".double()"),
]
_FLOAT32_TEXT = re.compile(r"torch\.float32\b|torch\.float\b|\.float\(\)")  # (comments may name float16)

_ORIGINALS = {}  # (id(owner), name) -> (owner, original attribute as stored in owner.__dict__ / the dict)
PATCH_LOG = []   # human-readable list of what apply() replaced


def _owner_and_name(module, path):
    """"A.b.c" -> (module.A.b, "c"); "D[key]" -> (module.D (a dict), "key")."""
    item = re.fullmatch(r"(.+)\[(.+)\]", path)
    if item:
        owner, name = _owner_and_name(module, item.group(1))
        return getattr(owner, name), item.group(2)
    parts = path.split(".")
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _get(owner, name):
    if isinstance(owner, dict):
        return owner[name]
    return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def _set(owner, name, value):
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def _recompile(module, owner, name):
    raw = _get(owner, name)
    func = raw.__func__ if isinstance(raw, staticmethod) else raw
    source = textwrap.dedent(inspect.getsource(func))  # getsource unwraps decorators, keeps their lines
    new = source
    for pattern, repl in _REPLACEMENTS:
        new = pattern.sub(repl, new)
    assert new != source, f"{module.__name__}.{name}: no float32 site found (transformers changed?)"
    leftover = _FLOAT32_TEXT.findall(new)
    assert not leftover, f"{module.__name__}.{name}: float32 text left after rewriting: {leftover}"
    namespace = {}
    code = compile(new, f"<fp64 {module.__name__}.{getattr(owner, '__name__', '')}.{name}>", "exec")
    exec(code, module.__dict__, namespace)  # globals: the module's own, looked up at call time
    (value,) = namespace.values()
    changed = sum(a != b for a, b in zip(source.splitlines(), new.splitlines()))
    return value, changed


def _site_groups(family):
    sites = SITES[family]
    return sites if isinstance(sites, list) else [sites]


def apply(*families):
    """Replace every float32 site of the given families (keys of SITES) by its float64 rewrite.
    Call before building a model: the RoPE inv_freq table is computed in __init__."""
    for family in families:
        for module_name, paths in _site_groups(family):
            module = importlib.import_module(module_name)
            for path in paths:
                owner, name = _owner_and_name(module, path)
                key = (id(owner), name)
                if key not in _ORIGINALS:
                    _ORIGINALS[key] = (owner, _get(owner, name))
                _set(owner, name, _ORIGINALS[key][1])  # rewrite from the original, not a rewrite
                value, changed = _recompile(module, owner, name)
                _set(owner, name, value)
                PATCH_LOG.append(f"{module_name}.{path} ({changed} lines)")


def restore():
    """Put every original back (transformers as shipped)."""
    for (_, name), (owner, value) in _ORIGINALS.items():
        _set(owner, name, value)


def recompiled(module_name, path):
    """The float64 rewrite of one function, without installing it."""
    module = importlib.import_module(module_name)
    owner, name = _owner_and_name(module, path)
    original = _ORIGINALS.get((id(owner), name), (owner, _get(owner, name)))[1]
    saved = _get(owner, name)
    _set(owner, name, original)
    try:
        return _recompile(module, owner, name)[0]
    finally:
        _set(owner, name, saved)


class Float32Leaks(TorchDispatchMode):
    """Records every op whose output holds a float32/float16/bfloat16 tensor (forward and backward),
    with the innermost transformers/tools source line that issued it (forward ops only have one)."""

    LOW = (torch.float32, torch.float16, torch.bfloat16)

    def __init__(self):
        super().__init__()
        self.leaks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        dtypes = {t.dtype for t in flat if isinstance(t, torch.Tensor) and t.dtype in self.LOW}
        if dtypes:
            where = "(autograd engine)"
            for frame in reversed(traceback.extract_stack()[:-1]):
                if "transformers" in frame.filename or "fp64 " in frame.filename or "tools/ref" in frame.filename:
                    where = f"{frame.filename}:{frame.lineno} {frame.line}"
                    break
            self.leaks.append(f"{func} -> {sorted(map(str, dtypes))} at {where}")
        return out


# ---- parameters --------------------------------------------------------------------------------

def randomize(model, generator, bias_std=0.1):
    """Every parameter random (float64): projections and experts N(0, 1/fan_in) so activations stay O(1),
    embeddings N(0, 1), biases N(0, 0.1²), norm weights 1 + N(0, 0.1²), or N(0, 0.1²) for the zero-centred
    (1 + w) norms of qwen3_next (HF initialises those offsets to 0), the gated norms of GDN / KDA (plain
    weights, init 1) 1 + N(0, 0.1²); the linear-attention A_log N(0, 0.25²) (any shape), dt_bias
    (1-D) N(0, 0.1²), conv1d weights [C, 1, K] N(0, 1/K); the router's e_score_correction_bias
    BUFFER gets N(0, bias_std²), so that it changes the expert selection of some tokens."""
    seen = set()  # a tied lm_head.weight IS embed_tokens.weight: randomised once, as the embedding
    with torch.no_grad():
        for module in model.modules():
            centred = type(module).__name__ == "Qwen3NextRMSNorm"
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
                if name == "A_log":  # GDN [nv], KDA [1,1,h,1]: decay rate exp(A_log) in about [0.6, 1.6]
                    p.copy_(0.25 * noise)
                elif "RMSNorm" in type(module).__name__ or "LayerNorm" in type(module).__name__:
                    p.copy_((0.0 if centred else 1.0) + 0.1 * noise)
                elif isinstance(module, torch.nn.Embedding):
                    p.copy_(noise)
                elif p.dim() == 1:
                    p.copy_(0.1 * noise)
                else:
                    p.copy_(noise / p.shape[-1] ** 0.5)
            for name, b in module.named_buffers(recurse=False):
                if name == "e_score_correction_bias":
                    b.copy_(bias_std * torch.randn(b.shape, generator=generator, dtype=torch.float64))


def our_ce(logits, targets):
    """Our convention: mean over targets != -100 of cross_entropy(logits[b, t], targets[b, t]) (no shift)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


# ---- routers -----------------------------------------------------------------------------------

def capture_router_logits(model):
    """Forward hooks on every router module (name ends in .mlp.gate): list of (name, logits [N, E])."""
    captured, handles = [], []
    for name, module in model.named_modules():
        if name.endswith(".mlp.gate") and "Router" in type(module).__name__:
            handles.append(module.register_forward_hook(
                lambda m, inp, out, name=name: captured.append((name, m, inp[0].detach(), out[0].detach()))))
    return captured, handles


def aux_loss_fp64(router_logits, num_experts, top_k):
    """load_balancing_loss_func (attention_mask None) re-derived in float64, pooled over layers:
    E · Σ_e f_e · P_e with f_e = (#top-k picks of e over all layers, tokens, k) / (L·N) and
    P_e = (Σ over layers, tokens of softmax p_e) / (L·N)."""
    counts = torch.zeros(num_experts, dtype=torch.float64)
    probs = torch.zeros(num_experts, dtype=torch.float64)
    rows = 0
    for logits in router_logits:
        p = torch.softmax(logits.double(), dim=-1)
        picks = torch.topk(p, top_k, dim=-1).indices.reshape(-1)
        counts += torch.bincount(picks, minlength=num_experts).double()
        probs += p.sum(0)
        rows += p.shape[0]
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def _boundary_gap(values, k):
    """Per row: value[k-1] - value[k] of the row sorted in decreasing order (inf if k == width)."""
    if k >= values.shape[-1]:
        return torch.full(values.shape[:-1], float("inf"), dtype=torch.float64)
    top = torch.sort(values, dim=-1, descending=True).values
    gap = top[..., k - 1] - top[..., k]
    return torch.where(torch.isinf(top[..., k]), torch.full_like(gap, float("inf")), gap)


def routing_margins(captured, config):
    """The smallest gap at each selection boundary of the captured routers (float64):
    'topk' (the k-th vs the (k+1)-th candidate of every token) and, for grouped routers, 'group'
    (the topk_group-th vs the next group score); 'bias_changed' counts (token, layer) pairs whose
    selected experts differ from those the scores without e_score_correction_bias would pick."""
    k = config.num_experts_per_tok
    result = {"topk": float("inf"), "group": float("inf"), "bias_changed": 0, "rows": 0}
    for _, module, _, logits in captured:
        logits = logits.double()
        result["rows"] += logits.shape[0]
        if hasattr(module, "e_score_correction_bias"):  # deepseek-style: sigmoid, bias, groups
            scores = torch.sigmoid(logits)
            choice = scores + module.e_score_correction_bias.double()
            n_group, topk_group = module.num_group, module.topk_group
            grouped = choice.view(-1, n_group, choice.shape[-1] // n_group)
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)
            result["group"] = min(result["group"], _boundary_gap(group_scores, topk_group).min().item())
            keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, dim=-1).indices, 1.0)
            mask = keep.unsqueeze(-1).expand_as(grouped).reshape(choice.shape).bool()
            masked = choice.masked_fill(~mask, float("-inf"))
            result["topk"] = min(result["topk"], _boundary_gap(masked, k).min().item())
            picked = masked.topk(k, dim=-1).indices.sort(-1).values
            # the same selection from the scores without the bias
            g0 = scores.view(-1, n_group, scores.shape[-1] // n_group).topk(2, dim=-1).values.sum(-1)
            keep0 = torch.zeros_like(g0).scatter_(1, g0.topk(topk_group, dim=-1).indices, 1.0)
            mask0 = keep0.unsqueeze(-1).expand_as(grouped).reshape(scores.shape).bool()
            picked0 = scores.masked_fill(~mask0, float("-inf")).topk(k, dim=-1).indices.sort(-1).values
            result["bias_changed"] += int((picked != picked0).any(-1).sum())
        else:  # qwen-style softmax top-k
            p = torch.softmax(logits, dim=-1)
            result["topk"] = min(result["topk"], _boundary_gap(p, k).min().item())
    return result


# ---- linear attention, re-derived ----------------------------------------------------------------

def _causal_conv_silu(x, w):
    """x [B, T, C], w [C, 1, K]: y[t] = silu(Σ_j w[c, j] · x[t - K + 1 + j]) (zeros before t = 0)."""
    T, K = x.shape[1], w.shape[-1]
    xp = F.pad(x, (0, 0, K - 1, 0))
    return F.silu(sum(w[:, 0, j] * xp[:, j:j + T] for j in range(K)))


def _delta_rule(q, k, v, g, beta):
    """Token-by-token (gated) delta rule: S = S·exp(g_t); S += k_t ⊗ β_t (v_t − Sᵀk_t); o_t = Sᵀq_t.
    q, k [B, T, H, dk], v [B, T, H, dv], beta [B, T, H]; g [B, T, H] (GDN) or [B, T, H, dk] (KDA, per key row)."""
    B, T, H, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        decay = g[:, t].exp()
        S = S * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
        err = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * err)
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1)


def linear_attention_fp64(m, x, eps):
    """An independent float64 re-derivation of one Qwen3NextGatedDeltaNet / KimiLinearDeltaAttention layer
    (no cache, no padding mask) from its input hidden states x [B, T, hid], with the recurrent (not the
    chunked) form of the kernel; eps is the gated norm's (config.rms_norm_eps)."""
    P = dict(m.named_parameters())
    B, T, _ = x.shape
    if type(m).__name__ == "Qwen3NextGatedDeltaNet":
        nk, nv, dk, dv = m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim
        r = nv // nk  # in_proj rows per k-head group g: [q_g dk | k_g dk | v_g r·dv | z_g r·dv], ba: [b_g r | a_g r]
        q, k, v, z = (x @ P["in_proj_qkvz.weight"].T).view(B, T, nk, -1).split([dk, dk, r * dv, r * dv], -1)
        b, a = (x @ P["in_proj_ba.weight"].T).view(B, T, nk, 2 * r).split([r, r], -1)
        mixed = _causal_conv_silu(torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], -1), P["conv1d.weight"])
        q, k, v = mixed.split([nk * dk, nk * dk, nv * dv], -1)
        q, k = (t.view(B, T, nk, dk).repeat_interleave(r, 2) for t in (q, k))  # v-head j uses k-head j // r
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        g = -P["A_log"].exp() * F.softplus(a.reshape(B, T, nv) + P["dt_bias"])
        o = _delta_rule(q, k, v.view(B, T, nv, dv), g, b.reshape(B, T, nv).sigmoid())
        gate, weight, out = F.silu(z.reshape(B, T, nv, dv)), P["norm.weight"], P["out_proj.weight"]
    else:
        h, D = m.num_heads, m.head_dim
        mixed = _causal_conv_silu(torch.cat([x @ P[f"{c}_proj.weight"].T for c in "qkv"], -1), P["conv1d.weight"])
        q, k, v = (t.view(B, T, h, D) for t in mixed.split([h * D] * 3, -1))
        q = q / ((q * q).sum(-1, keepdim=True) + 1e-6).sqrt() * D ** -0.5
        k = k / ((k * k).sum(-1, keepdim=True) + 1e-6).sqrt()
        f = x @ P["forget_gate.f_a_proj.weight"].T @ P["forget_gate.f_b_proj.weight"].T + P["forget_gate.dt_bias"]
        g = -P["forget_gate.A_log"].exp().view(1, 1, h, 1) * F.softplus(f).view(B, T, h, D)
        o = _delta_rule(q, k, v, g, (x @ P["b_proj.weight"].T).sigmoid())
        gate = (x @ P["g_a_proj.weight"].T @ P["g_b_proj.weight"].T).view(B, T, h, D).sigmoid()
        weight, out = P["o_norm.weight"], P["o_proj.weight"]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight * gate
    return o.reshape(B, T, -1) @ out.T


def capture_linear_attention(model):
    """Forward hooks on every GDN / KDA layer: list of (module, input hidden states, output)."""
    captured, handles = [], []
    for module in model.modules():
        if type(module).__name__ in ("Qwen3NextGatedDeltaNet", "KimiLinearDeltaAttention"):
            handles.append(module.register_forward_hook(
                lambda m, args, kwargs, out: captured.append((m, kwargs.get("hidden_states", args[0] if args
                                                                            else None).detach(), out.detach())),
                with_kwargs=True))
    return captured, handles


# ---- DeepSeek-V3.2 lightning indexer ---------------------------------------------------------------

def capture_indexers(model):
    """Forward hooks on every DeepseekV32Indexer: list of (module, hidden_states, q_resid, (cos, sin),
    selected indices [B, S, topk] int32), in layer order."""
    captured, handles = [], []
    for module in model.modules():
        if type(module).__name__ == "DeepseekV32Indexer":
            handles.append(module.register_forward_hook(
                lambda m, args, out: captured.append((m, args[0].detach(), args[1].detach(),
                                                      tuple(t.detach() for t in args[2]), out.detach()))))
    return captured, handles


def indexer_scores_fp64(m, x, q_resid, cos, sin):
    """DeepseekV32Indexer's scores re-derived in float64, causal (t > s is -inf): [B, S, T]
    I[b,s,t] = Σ_h w[b,s,h]·hi^-0.5 · relu(q[b,s,h]·k[b,t]·di^-0.5), q = wq_b(q_resid), k = LayerNorm(wk(x)),
    half-split RoPE on the first qk_rope_head_dim dims of q and k (cos / sin [B, S, r] = cat(freqs, freqs))."""
    P = dict(m.named_parameters())
    B, S, _ = x.shape
    hi, di, r = m.n_heads, m.head_dim, m.qk_rope_head_dim

    def rope(t, c, s_):  # t [..., di]: rotate_half on t[..., :r]
        rot, rest = t[..., :r], t[..., r:]
        half = torch.cat([-rot[..., r // 2:], rot[..., : r // 2]], -1)
        return torch.cat([rot * c + half * s_, rest], -1)

    q = rope((q_resid @ P["wq_b.weight"].T).view(B, S, hi, di), cos[:, :, None], sin[:, :, None])
    k = rope(F.layer_norm(x @ P["wk.weight"].T, (di,), P["k_norm.weight"], P["k_norm.bias"], m.k_norm.eps), cos, sin)
    scores = torch.relu(torch.einsum("bshd,btd->bsht", q, k) * di ** -0.5)
    w = (x @ P["weights_proj.weight"].T) * hi ** -0.5
    index = torch.einsum("bsh,bsht->bst", w, scores)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return index.masked_fill(~causal, float("-inf"))


def indexer_margin(index, topk):
    """Smallest relative gap (k-th minus (k+1)-th largest, over the row's largest |score|) over the query rows
    that see more than topk keys (row s sees s + 1 keys); inf if there is none."""
    worst = float("inf")
    for s in range(topk, index.shape[1]):
        row = index[:, s, : s + 1]
        top = torch.sort(row, -1, descending=True).values
        gap = (top[:, topk - 1] - top[:, topk]) / row.abs().amax(-1).clamp_min(1e-300)
        worst = min(worst, gap.min().item())
    return worst
