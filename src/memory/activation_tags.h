// The static tags under which modules save the activations their backward needs, and what the
// memory policy needs to know of each: which sublayer produces it (so recompute knows what to
// re-run) and what kind of tensor it is (so presets can name groups: GEMM outputs, norm outputs…).
#pragma once

#include <string>

namespace trillion {

// Every activation a module saves for its backward, declared once here: X(tag, sublayer, kind)
// gives the enum, the names, sublayers and kinds below. The shape of each tensor comes from its
// layer kind's declaration (saved_tensors, memory/saved_tensors.h). Shapes here: N = tokens
// (batch · seq), D = hidden, Hq / Hkv = query / key-value heads, d = head dim, I = MLP width,
// E = routed experts, k = experts per token, R = routed rows kept (≤ N · k), Is = shared width.
#define TRILLION_ACTIVATION_TAGS(X) \
  X(attn_input, mixer, input)         /* [N, D]        residual stream entering the mixer sublayer (every mixer kind) */ \
  X(attn_norm_rstd, mixer, statistic) /* [N] */ \
  X(attn_norm_out, mixer, cheap)      /* [N, D]        input of q/k/v projections */ \
  X(q_raw, mixer, gemm)               /* [N, Hq, d]    query before q_norm */ \
  X(q_rstd, mixer, statistic)         /* [N · Hq] */ \
  X(q, mixer, cheap)                  /* [N, Hq, d]    query after q_norm and RoPE */ \
  X(gate, mixer, gemm)                /* [N, Hq · d]   output gate (qwen3_next) */ \
  X(k_raw, mixer, gemm)               /* [N, Hkv, d]   key before k_norm */ \
  X(k_rstd, mixer, statistic)         /* [N · Hkv] */ \
  X(k, mixer, cheap)                  /* [N, Hkv, d]   key after k_norm and RoPE */ \
  X(v, mixer, gemm)                   /* [N, Hkv, d] */ \
  X(attn_out, mixer, attention)       /* [N, Hq · d]   attention output (before the gate) */ \
  X(attn_lse, mixer, statistic)       /* [B, Hq, S] */ \
  X(o_proj_in, mixer, cheap)          /* [N, Hq · d]   gated attention output (qwen3_next) */ \
  /* Linear-attention mixers (Gated DeltaNet; Kimi Delta Attention: nk = nv = h, dk = dv = D): */ \
  X(la_conv_in, mixer, gemm)          /* [N, Cc]       [q | k | v] before the conv (GDN: Cc = 2·nk·dk + nv·dv; KDA: 3·h·D) */ \
  X(la_q_hat, mixer, cheap)           /* [N, nk, dk]   L2-normalized query (before the dk^−½ scale) */ \
  X(la_q_inv, mixer, statistic)       /* [N · nk]      its inverse norms */ \
  X(la_k_hat, mixer, cheap)           /* [N, nk, dk]   L2-normalized key */ \
  X(la_k_inv, mixer, statistic)       /* [N · nk] */ \
  X(la_v, mixer, cheap)               /* [N, nv, dv]   value after the conv */ \
  X(la_z, mixer, gemm)                /* [N, nv, dv]   output gate input (GDN: z; KDA: g_b_proj(g_a_proj(h))) */ \
  X(la_a, mixer, gemm)                /* [N, nv] (GDN) or [N, h·D] (KDA)  decay input (before the gate) */ \
  X(la_g, mixer, cheap)               /* shape of la_a log decay */ \
  X(la_beta, mixer, cheap)            /* [N, nv] */ \
  X(la_core, mixer, attention)        /* [N, nv, dv]   delta-rule output */ \
  X(la_norm_rstd, mixer, statistic)   /* [N · nv] */ \
  X(la_normed, mixer, cheap)          /* [N, nv · dv]  gated-norm output (out_proj input) */ \
  X(la_f_low, mixer, gemm)            /* [N, D]        KDA: f_a_proj(h), the decay's low-rank input */ \
  X(la_g_low, mixer, gemm)            /* [N, D]        KDA: g_a_proj(h), the output gate's low-rank input */ \
  /* Multi-head latent attention (with q, k [N, H, qk], v [N, H, v], attn_out [N, H · v], attn_lse): */ \
  X(mla_q_a, mixer, gemm)             /* [N, r_q]      q_a_proj(h) */ \
  X(mla_q_a_rstd, mixer, statistic)   /* [N] */ \
  X(mla_q_latent, mixer, cheap)       /* [N, r_q]      q_a_layernorm output (the query latent) */ \
  X(mla_kv_a, mixer, gemm)            /* [N, r_kv + rope] kv_a_proj_with_mqa(h): [c_raw | k_rot], k_rot after RoPE */ \
  X(mla_kv_rstd, mixer, statistic)    /* [N] */ \
  X(mla_latent, mixer, cheap)         /* [N, r_kv]     c = kv_a_layernorm(c_raw) */ \
  /* Sparse attention (lightning indexer: H_I heads of d_I): */ \
  X(attn_indices, mixer, decision)    /* [N, topk] int32 the selected keys of each query (−1 padded) */ \
  X(idx_k_raw, mixer, gemm)           /* [N, d_I]      indexer.wk(h), before its LayerNorm */ \
  X(idx_k_mean, mixer, statistic)     /* [N] */ \
  X(idx_k_rstd, mixer, statistic)     /* [N] */ \
  X(idx_dq, mixer, attention)         /* [N, H_I, d_I] indexer loss gradient wrt the indexer query (after RoPE) */ \
  X(idx_dk, mixer, attention)         /* [N, d_I]      … wrt the indexer key (after RoPE) */ \
  X(idx_dw, mixer, attention)         /* [N, H_I]      … wrt the head weights */ \
  X(ffn_input, ffn, input)            /* [N, D]        residual stream entering the FFN sublayer */ \
  X(ffn_norm_rstd, ffn, statistic)    /* [N] */ \
  X(ffn_norm_out, ffn, cheap)         /* [N, D]        input of the dense MLP or the MoE */ \
  X(mlp_gate, ffn, gemm)              /* [N, I] */ \
  X(mlp_up, ffn, gemm)                /* [N, I] */ \
  X(mlp_act, ffn, cheap)              /* [N, I]        silu(gate) · up */ \
  X(router_logits, ffn, gemm)         /* [N, E] */ \
  X(router_scores, ffn, cheap)        /* [N, E]        softmax or sigmoid of the logits */ \
  X(router_index, ffn, decision)      /* [N, k] int32  the routing decision */ \
  X(router_weight, ffn, cheap)        /* [N, k]        combine weights */ \
  X(expert_gate_up, ffn, gemm)        /* [R, 2I]       grouped gate/up output, pre-activation */ \
  X(expert_act, ffn, cheap)           /* [R, I] */ \
  X(expert_out, ffn, gemm)            /* [R, D]        expert outputs before weighting */ \
  X(shared_gate, ffn, gemm)           /* [N, Is] */ \
  X(shared_up, ffn, gemm)             /* [N, Is] */ \
  X(shared_act, ffn, cheap)           /* [N, Is] */ \
  X(shared_out, ffn, gemm)            /* [N, D]        shared expert output before its gate (qwen3_next) */ \
  X(shared_gate_logit, ffn, gemm)     /* [N]        shared_expert_gate(h) (qwen3_next) */ \
  X(final_input, head, input)         /* [N, D]        residual stream entering the final norm */ \
  X(final_norm_rstd, head, statistic) /* [N] */ \
  X(final_norm_out, head, cheap)      /* [N, D] */ \
  X(loss_lse, head, statistic)        /* [N]           LM-head log-sum-exp (loss gradients recomputed in the backward) */ \
  X(loss_dh, head, gemm)              /* [N, D]        d objective / d final-norm output (loss gradients formed in the forward) */

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
//   decision   discrete decisions (routing, selected keys), also kept in the decision log; their
//              elements are int32, every other tag's the model's floating type.
enum class TagKind { input, gemm, attention, cheap, statistic, decision };

#define TRILLION_TAG_ENUM(name, sublayer, kind) name,
enum class ActivationTag : int { TRILLION_ACTIVATION_TAGS(TRILLION_TAG_ENUM) count_ /* not a tag */ };
#undef TRILLION_TAG_ENUM

const char* activation_tag_name(ActivationTag tag);
// The tag of a name activation_tag_name gives; fails with the list of names otherwise.
ActivationTag activation_tag_from_name(const std::string& name);
TagSublayer tag_sublayer(ActivationTag tag);
// Whether recompute re-runs `sublayer` when `tag` was dropped: its own sublayer, and the mixer for
// ffn_input too (the mixer's output is the FFN's input).
inline bool recompute_reruns(ActivationTag tag, TagSublayer sublayer) {
  return tag_sublayer(tag) == sublayer || (sublayer == TagSublayer::mixer && tag == ActivationTag::ffn_input);
}
TagKind tag_kind(ActivationTag tag);
constexpr int kNumActivationTags = static_cast<int>(ActivationTag::count_);

}  // namespace trillion
