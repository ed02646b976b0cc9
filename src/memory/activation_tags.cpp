// The activation tags' names, sublayers and kinds (one row per tag, in enum order).
#include "memory/activation_tags.h"

#include "core/error.h"

namespace trillion {
namespace {

struct TagInfo {
  const char* name;
  TagSublayer sublayer;
  TagKind kind;
};

constexpr TagInfo kTags[] = {
    {"attn_input", TagSublayer::mixer, TagKind::input},
    {"attn_norm_rstd", TagSublayer::mixer, TagKind::statistic},
    {"attn_norm_out", TagSublayer::mixer, TagKind::cheap},
    {"q_raw", TagSublayer::mixer, TagKind::gemm},
    {"q_rstd", TagSublayer::mixer, TagKind::statistic},
    {"q", TagSublayer::mixer, TagKind::cheap},
    {"gate", TagSublayer::mixer, TagKind::gemm},
    {"k_raw", TagSublayer::mixer, TagKind::gemm},
    {"k_rstd", TagSublayer::mixer, TagKind::statistic},
    {"k", TagSublayer::mixer, TagKind::cheap},
    {"v", TagSublayer::mixer, TagKind::gemm},
    {"attn_out", TagSublayer::mixer, TagKind::attention},
    {"attn_lse", TagSublayer::mixer, TagKind::statistic},
    {"o_proj_in", TagSublayer::mixer, TagKind::cheap},
    {"la_conv_in", TagSublayer::mixer, TagKind::gemm},
    {"la_q_hat", TagSublayer::mixer, TagKind::cheap},
    {"la_q_inv", TagSublayer::mixer, TagKind::statistic},
    {"la_k_hat", TagSublayer::mixer, TagKind::cheap},
    {"la_k_inv", TagSublayer::mixer, TagKind::statistic},
    {"la_v", TagSublayer::mixer, TagKind::cheap},
    {"la_z", TagSublayer::mixer, TagKind::gemm},
    {"la_a", TagSublayer::mixer, TagKind::gemm},
    {"la_g", TagSublayer::mixer, TagKind::cheap},
    {"la_beta", TagSublayer::mixer, TagKind::cheap},
    {"la_core", TagSublayer::mixer, TagKind::attention},
    {"la_norm_rstd", TagSublayer::mixer, TagKind::statistic},
    {"la_normed", TagSublayer::mixer, TagKind::cheap},
    {"la_f_low", TagSublayer::mixer, TagKind::gemm},
    {"la_g_low", TagSublayer::mixer, TagKind::gemm},
    {"mla_q_a", TagSublayer::mixer, TagKind::gemm},
    {"mla_q_a_rstd", TagSublayer::mixer, TagKind::statistic},
    {"mla_q_latent", TagSublayer::mixer, TagKind::cheap},
    {"mla_kv_a", TagSublayer::mixer, TagKind::gemm},
    {"mla_kv_rstd", TagSublayer::mixer, TagKind::statistic},
    {"mla_latent", TagSublayer::mixer, TagKind::cheap},
    {"attn_indices", TagSublayer::mixer, TagKind::decision},
    {"idx_k_raw", TagSublayer::mixer, TagKind::gemm},
    {"idx_k_mean", TagSublayer::mixer, TagKind::statistic},
    {"idx_k_rstd", TagSublayer::mixer, TagKind::statistic},
    {"idx_dq", TagSublayer::mixer, TagKind::attention},
    {"idx_dk", TagSublayer::mixer, TagKind::attention},
    {"idx_dw", TagSublayer::mixer, TagKind::attention},
    {"ffn_input", TagSublayer::ffn, TagKind::input},
    {"ffn_norm_rstd", TagSublayer::ffn, TagKind::statistic},
    {"ffn_norm_out", TagSublayer::ffn, TagKind::cheap},
    {"mlp_gate", TagSublayer::ffn, TagKind::gemm},
    {"mlp_up", TagSublayer::ffn, TagKind::gemm},
    {"mlp_act", TagSublayer::ffn, TagKind::cheap},
    {"router_logits", TagSublayer::ffn, TagKind::gemm},
    {"router_scores", TagSublayer::ffn, TagKind::cheap},
    {"router_index", TagSublayer::ffn, TagKind::decision},
    {"router_weight", TagSublayer::ffn, TagKind::cheap},
    {"expert_gate_up", TagSublayer::ffn, TagKind::gemm},
    {"expert_act", TagSublayer::ffn, TagKind::cheap},
    {"expert_out", TagSublayer::ffn, TagKind::gemm},
    {"shared_gate", TagSublayer::ffn, TagKind::gemm},
    {"shared_up", TagSublayer::ffn, TagKind::gemm},
    {"shared_act", TagSublayer::ffn, TagKind::cheap},
    {"shared_out", TagSublayer::ffn, TagKind::gemm},
    {"shared_gate_logit", TagSublayer::ffn, TagKind::gemm},
    {"final_input", TagSublayer::head, TagKind::input},
    {"final_norm_rstd", TagSublayer::head, TagKind::statistic},
    {"final_norm_out", TagSublayer::head, TagKind::cheap},
    {"loss_lse", TagSublayer::head, TagKind::statistic},
    {"loss_dh", TagSublayer::head, TagKind::gemm},
};
static_assert(sizeof(kTags) / sizeof(kTags[0]) == kNumActivationTags, "one row per activation tag");

const TagInfo& info(ActivationTag tag) {
  TRILLION_CHECK(tag != ActivationTag::count_, "count_ is not a tag");
  return kTags[static_cast<int>(tag)];
}

}  // namespace

const char* activation_tag_name(ActivationTag tag) { return info(tag).name; }
TagSublayer tag_sublayer(ActivationTag tag) { return info(tag).sublayer; }
TagKind tag_kind(ActivationTag tag) { return info(tag).kind; }

ActivationTag activation_tag_from_name(const std::string& name) {
  std::string names;
  for (int i = 0; i < kNumActivationTags; ++i) {
    if (name == kTags[i].name) return static_cast<ActivationTag>(i);
    names += (i ? ", " : "") + std::string(kTags[i].name);
  }
  fail("unknown activation tag \"", name, "\"; expected one of: ", names);
}

}  // namespace trillion
