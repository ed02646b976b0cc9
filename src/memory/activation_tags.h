// The static tags under which modules save the activations their backward needs, and what the
// memory policy needs to know of each: which sublayer produces it (so recompute knows what to
// re-run) and what kind of tensor it is (so presets can name groups: GEMM outputs, norm outputs…).
#pragma once

#include <string>

namespace trillion {

// Every activation a module saves for its backward, declared once here: X(tag, sublayer, kind,
// element) gives the enum, the names, sublayers, kinds and element types below. The shape of each tensor comes from its
// layer kind's declaration (saved_tensors, memory/saved_tensors.h). Shapes here: N = tokens
// (batch · seq), D = hidden, Hq / Hkv = query / key-value heads, d = head dim, I = MLP width,
// E = routed experts, k = experts per token, R = routed rows kept (≤ N · k), Is = shared width.
#define TRILLION_ACTIVATION_TAGS(X) \
  X(attn_input, mixer, input, real)         /* [N, D]        residual stream entering the mixer sublayer (every mixer kind) */ \
  X(attn_norm_rstd, mixer, statistic, real) /* [N] */ \
  X(attn_norm_out, mixer, cheap, real)      /* [N, D]        input of q/k/v projections */ \
  X(q_raw, mixer, gemm, real)               /* [N, Hq, d]    query before q_norm */ \
  X(q_rstd, mixer, statistic, real)         /* [N · Hq] */ \
  X(q, mixer, cheap, real)                  /* [N, Hq, d]    query after q_norm and RoPE */ \
  X(gate, mixer, gemm, real)                /* [N, Hq · d]   output gate (qwen3_next) */ \
  X(k_raw, mixer, gemm, real)               /* [N, Hkv, d]   key before k_norm */ \
  X(k_rstd, mixer, statistic, real)         /* [N · Hkv] */ \
  X(k, mixer, cheap, real)                  /* [N, Hkv, d]   key after k_norm and RoPE */ \
  X(v, mixer, gemm, real)                   /* [N, Hkv, d] */ \
  X(attn_out, mixer, attention, real)       /* [N, Hq · d]   attention output (before the gate) */ \
  X(attn_lse, mixer, statistic, real)       /* [B, Hq, S] */ \
  X(o_proj_in, mixer, cheap, real)          /* [N, Hq · d]   gated attention output (qwen3_next) */ \
  /* Linear-attention mixers (Gated DeltaNet; Kimi Delta Attention: nk = nv = h, dk = dv = D): */ \
  X(la_conv_in, mixer, gemm, real)          /* [N, Cc]       [q | k | v] before the conv (GDN: Cc = 2·nk·dk + nv·dv; KDA: 3·h·D) */ \
  X(la_q_hat, mixer, cheap, real)           /* [N, nk, dk]   L2-normalized query (before the dk^−½ scale) */ \
  X(la_q_inv, mixer, statistic, real)       /* [N · nk]      its inverse norms */ \
  X(la_k_hat, mixer, cheap, real)           /* [N, nk, dk]   L2-normalized key */ \
  X(la_k_inv, mixer, statistic, real)       /* [N · nk] */ \
  X(la_v, mixer, cheap, real)               /* [N, nv, dv]   value after the conv */ \
  X(la_z, mixer, gemm, real)                /* [N, nv, dv]   output gate input (GDN: z; KDA: g_b_proj(g_a_proj(h))) */ \
  X(la_a, mixer, gemm, real)                /* [N, nv] (GDN) or [N, h·D] (KDA)  decay input (before the gate) */ \
  X(la_g, mixer, cheap, real)               /* shape of la_a log decay */ \
  X(la_beta, mixer, cheap, real)            /* [N, nv] */ \
  X(la_core, mixer, attention, real)        /* [N, nv, dv]   delta-rule output */ \
  X(la_norm_rstd, mixer, statistic, real)   /* [N · nv] */ \
  X(la_normed, mixer, cheap, real)          /* [N, nv · dv]  gated-norm output (out_proj input) */ \
  X(la_f_low, mixer, gemm, real)            /* [N, D]        KDA: f_a_proj(h), the decay's low-rank input */ \
  X(la_g_low, mixer, gemm, real)            /* [N, D]        KDA: g_a_proj(h), the output gate's low-rank input */ \
  /* Multi-head latent attention (with q, k [N, H, qk], v [N, H, v], attn_out [N, H · v], attn_lse): */ \
  X(mla_q_a, mixer, gemm, real)             /* [N, r_q]      q_a_proj(h) */ \
  X(mla_q_a_rstd, mixer, statistic, real)   /* [N] */ \
  X(mla_q_latent, mixer, cheap, real)       /* [N, r_q]      q_a_layernorm output (the query latent) */ \
  X(mla_kv_a, mixer, gemm, real)            /* [N, r_kv + rope] kv_a_proj_with_mqa(h): [c_raw | k_rot], k_rot after RoPE */ \
  X(mla_kv_rstd, mixer, statistic, real)    /* [N] */ \
  X(mla_latent, mixer, cheap, real)         /* [N, r_kv]     c = kv_a_layernorm(c_raw) */ \
  X(mla_out_latent, mixer, attention, real) /* [N, H, L]     absorbed form (context parallelism): the output over the latents, L = r_kv (+ kv_b_proj's adapter rank) */ \
  /* Sparse attention (lightning indexer: H_I heads of d_I): */ \
  X(attn_indices, mixer, decision, int32)   /* [N, topk] int32 the selected keys of each query (−1 padded) */ \
  X(idx_k_raw, mixer, gemm, real)           /* [N, d_I]      indexer.wk(h), before its LayerNorm */ \
  X(idx_k_mean, mixer, statistic, real)     /* [N] */ \
  X(idx_k_rstd, mixer, statistic, real)     /* [N] */ \
  X(idx_dq, mixer, attention, real)         /* [N, H_I, d_I] indexer loss gradient wrt the indexer query (after RoPE) */ \
  X(idx_dk, mixer, attention, real)         /* [N, d_I]      … wrt the indexer key (after RoPE) */ \
  X(idx_dw, mixer, attention, real)         /* [N, H_I]      … wrt the head weights */ \
  X(ffn_input, ffn, input, real)            /* [N, D]        residual stream entering the FFN sublayer */ \
  X(ffn_norm_rstd, ffn, statistic, real)    /* [N] */ \
  X(ffn_norm_out, ffn, cheap, real)         /* [N, D]        input of the dense MLP or the MoE */ \
  X(mlp_gate, ffn, gemm, real)              /* [N, I] */ \
  X(mlp_up, ffn, gemm, real)                /* [N, I] */ \
  X(mlp_act, ffn, cheap, real)              /* [N, I]        silu(gate) · up */ \
  X(router_logits, ffn, gemm, real)         /* [N, E] */ \
  X(router_scores, ffn, cheap, real)        /* [N, E]        softmax or sigmoid of the logits */ \
  X(router_index, ffn, decision, int32)     /* [N, k] int32  the routing decision */ \
  X(router_weight, ffn, cheap, real)        /* [N, k]        combine weights */ \
  X(expert_gate_up, ffn, gemm, real)        /* [R, 2I]       grouped gate/up output, pre-activation */ \
  X(expert_act, ffn, cheap, real)           /* [R, I] */ \
  /* Expert parallelism (parallel/expert_parallel.h), R = rows this rank's experts receive, chunk-major: */ \
  X(ep_row_source, ffn, exchanged, int32)   /* [R] int32     (chunk · ep + source) · local experts + local expert */ \
  X(ep_received, ffn, exchanged, real)      /* [R, D]        the rows dispatched to this rank's experts */ \
  X(ep_gate_up, ffn, exchanged, real)       /* [R, 2I]       their grouped gate/up output */ \
  X(ep_act, ffn, exchanged, real)           /* [R, I] */ \
  X(ep_weight, ffn, exchanged, real)        /* [R]           their combine weights */ \
  X(shared_gate, ffn, gemm, real)           /* [N, Is] */ \
  X(shared_up, ffn, gemm, real)             /* [N, Is] */ \
  X(shared_act, ffn, cheap, real)           /* [N, Is] */ \
  X(shared_out, ffn, gemm, real)            /* [N, D]        shared expert output before its gate (qwen3_next) */ \
  X(shared_gate_logit, ffn, gemm, real)     /* [N]        shared_expert_gate(h) (qwen3_next) */ \
  X(final_input, head, input, real)         /* [N, D]        residual stream entering the final norm */ \
  X(final_norm_rstd, head, statistic, real) /* [N] */ \
  X(final_norm_out, head, cheap, real)      /* [N, D] */ \
  X(loss_lse, head, statistic, real)        /* [N]           LM-head log-sum-exp (loss gradients recomputed in the backward) */ \
  X(loss_dh, head, gemm, real)              /* [N, D]        d objective / d final-norm output (loss gradients formed in the forward) */

// Where a tag's tensor is produced: the mixer sublayer (from attn_input), the FFN sublayer (from
// ffn_input) or the head (final norm and loss, saved under layer index L = number of layers).
enum class TagSublayer { mixer, ffn, head };

// What a tag's tensor is, for the policy presets:
//   input      a copy of the residual stream entering a sublayer (attn_input is the layer's
//              recompute checkpoint);
//   gemm       the output of a GEMM or grouped GEMM (expensive to recompute: the swap candidates);
//   attention  the output of an attention kernel or of the indexer loss;
//   cheap      element-wise, norm, RoPE, conv or router-softmax outputs (cheap to recompute);
//   statistic  per-row statistics (rstd, norms, lse), small;
//   decision   discrete decisions (routing, selected keys), also kept in the decision log;
//   exchanged  what the expert exchange received or computed from received rows: never recomputed,
//              since re-running the exchange would need every rank of its group (swap may move it).
enum class TagKind { input, gemm, attention, cheap, statistic, decision, exchanged };

// A tag's elements: int32 (decisions, row sources) or the model's floating type (real).
enum class TagElement { real, int32 };

#define TRILLION_TAG_ENUM(name, sublayer, kind, element) name,
enum class ActivationTag : int { TRILLION_ACTIVATION_TAGS(TRILLION_TAG_ENUM) count_ /* not a tag */ };
#undef TRILLION_TAG_ENUM

const char* activation_tag_name(ActivationTag tag);
// The tag of a name activation_tag_name gives; fails with the list of names otherwise.
ActivationTag activation_tag_from_name(const std::string& name);
TagSublayer tag_sublayer(ActivationTag tag);
// Whether the backward that reads `tag` forms it again itself when it was dropped, with no re-run:
// the routed experts' gate/up rows and act, formed again inside the fused backward's row tiles from
// the rows' inputs (ops/moe_experts.h), on one rank and on the owners under expert parallelism.
bool rebuilt_by_its_backward(ActivationTag tag);
// Whether recompute re-runs `sublayer` when `tag` was dropped: its own sublayer, and the mixer for
// ffn_input too (the mixer's output is the FFN's input); never for a tag its backward rebuilds.
inline bool recompute_reruns(ActivationTag tag, TagSublayer sublayer) {
  if (rebuilt_by_its_backward(tag)) return false;
  return tag_sublayer(tag) == sublayer || (sublayer == TagSublayer::mixer && tag == ActivationTag::ffn_input);
}
TagKind tag_kind(ActivationTag tag);
TagElement tag_element(ActivationTag tag);
// Why recompute cannot refill `tag` (attn_input, the head's tags, the exchanged ones but those
// their backward rebuilds), or null.
const char* why_not_recomputable(ActivationTag tag);
constexpr int kNumActivationTags = static_cast<int>(ActivationTag::count_);

}  // namespace trillion
