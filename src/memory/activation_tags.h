// The static tags under which modules save the activations their backward needs, and what the
// memory policy needs to know of each: which sublayer produces it (so recompute knows what to
// re-run) and what kind of tensor it is (so presets can name groups: GEMM outputs, norm outputs…).
#pragma once

#include <string>

namespace trillion {

// Every activation a module saves for its backward. Shapes: N = tokens (batch · seq), D = hidden,
// Hq / Hkv = query / key-value heads, d = head dim, I = MLP width, E = routed experts, k = experts
// per token, R = routed rows kept (≤ N · k), Is = shared expert width.
enum class ActivationTag : int {
  attn_input,     // [N, D]        residual stream entering the mixer sublayer (every mixer kind)
  attn_norm_rstd, // [N]
  attn_norm_out,  // [N, D]        input of q/k/v projections
  q_raw,          // [N, Hq, d]    query before q_norm
  q_rstd,         // [N · Hq]
  q,              // [N, Hq, d]    query after q_norm and RoPE
  gate,           // [N, Hq · d]   output gate (qwen3_next)
  k_raw,          // [N, Hkv, d]   key before k_norm
  k_rstd,         // [N · Hkv]
  k,              // [N, Hkv, d]   key after k_norm and RoPE
  v,              // [N, Hkv, d]
  attn_out,       // [N, Hq · d]   attention output (before the gate)
  attn_lse,       // [B, Hq, S]
  o_proj_in,      // [N, Hq · d]   gated attention output (qwen3_next)
  // Linear-attention mixers (Gated DeltaNet; Kimi Delta Attention: nk = nv = h, dk = dv = D):
  la_conv_in,    // [N, Cc]       [q | k | v] before the conv (GDN: Cc = 2·nk·dk + nv·dv; KDA: 3·h·D)
  la_q_hat,      // [N, nk, dk]   L2-normalized query (before the dk^−½ scale)
  la_q_inv,      // [N · nk]      its inverse norms
  la_k_hat,      // [N, nk, dk]   L2-normalized key
  la_k_inv,      // [N · nk]
  la_v,          // [N, nv, dv]   value after the conv
  la_z,          // [N, nv, dv]   output gate input (GDN: z; KDA: g_b_proj(g_a_proj(h)))
  la_a,          // [N, nv] (GDN) or [N, h·D] (KDA)  decay input (before the gate)
  la_g,          // shape of la_a log decay
  la_beta,       // [N, nv]
  la_core,       // [N, nv, dv]   delta-rule output
  la_norm_rstd,  // [N · nv]
  la_normed,     // [N, nv · dv]  gated-norm output (out_proj input)
  la_f_low,      // [N, D]        KDA: f_a_proj(h), the decay's low-rank input
  la_g_low,      // [N, D]        KDA: g_a_proj(h), the output gate's low-rank input
  // Multi-head latent attention (with q, k [N, H, qk], v [N, H, v], attn_out [N, H · v], attn_lse):
  mla_q_a,       // [N, r_q]      q_a_proj(h)
  mla_q_a_rstd,  // [N]
  mla_q_latent,  // [N, r_q]      q_a_layernorm output (the query latent)
  mla_kv_a,      // [N, r_kv + rope] kv_a_proj_with_mqa(h): [c_raw | k_rot], k_rot after RoPE
  mla_kv_rstd,   // [N]
  mla_latent,    // [N, r_kv]     c = kv_a_layernorm(c_raw)
  // Sparse attention (lightning indexer: H_I heads of d_I):
  attn_indices,  // [N, topk] int32 the selected keys of each query (−1 padded)
  idx_k_raw,     // [N, d_I]      indexer.wk(h), before its LayerNorm
  idx_k_mean,    // [N]
  idx_k_rstd,    // [N]
  idx_dq,        // [N, H_I, d_I] indexer loss gradient wrt the indexer query (after RoPE)
  idx_dk,        // [N, d_I]      … wrt the indexer key (after RoPE)
  idx_dw,        // [N, H_I]      … wrt the head weights
  ffn_input,      // [N, D]        residual stream entering the FFN sublayer
  ffn_norm_rstd,  // [N]
  ffn_norm_out,   // [N, D]        input of the dense MLP or the MoE
  mlp_gate,       // [N, I]
  mlp_up,         // [N, I]
  mlp_act,        // [N, I]        silu(gate) · up
  router_logits,  // [N, E]
  router_scores,  // [N, E]        softmax or sigmoid of the logits
  router_index,   // [N, k] int32  the routing decision
  router_weight,  // [N, k]        combine weights
  expert_gate_up, // [R, 2I]       grouped gate/up output, pre-activation
  expert_act,     // [R, I]
  expert_out,     // [R, D]        expert outputs before weighting
  shared_gate,    // [N, Is]
  shared_up,      // [N, Is]
  shared_act,     // [N, Is]
  shared_out,     // [N, D]        shared expert output before its gate (qwen3_next)
  shared_gate_logit, // [N]        shared_expert_gate(h) (qwen3_next)
  final_input,    // [N, D]        residual stream entering the final norm
  final_norm_rstd,// [N]
  final_norm_out, // [N, D]
  loss_lse,       // [N]           LM-head log-sum-exp (loss gradients recomputed in the backward)
  loss_dh,        // [N, D]        d objective / d final-norm output (loss gradients formed in the forward)
  count_          // number of tags (not a tag)
};

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
//   decision   discrete decisions (routing, selected keys), also kept in the decision log.
enum class TagKind { input, gemm, attention, cheap, statistic, decision };

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
