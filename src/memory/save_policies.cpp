// Presets and tag lists of --recompute / --swap (see the header).
#include "memory/save_policies.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "core/error.h"

namespace trillion {
namespace {

std::vector<ActivationTag> tags_where(const std::function<bool(ActivationTag)>& keep) {
  std::vector<ActivationTag> tags;
  for (int i = 0; i < kNumActivationTags; ++i)
    if (keep(static_cast<ActivationTag>(i))) tags.push_back(static_cast<ActivationTag>(i));
  return tags;
}

// A comma-separated list of tag names ("none": empty); `option` names the flag in errors.
std::vector<ActivationTag> tag_list(const std::string& spec, const char* option) {
  std::vector<ActivationTag> tags;
  std::stringstream in(spec);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) fail(option, " ", spec, ": empty tag name");
    try {
      tags.push_back(activation_tag_from_name(name));
    } catch (const Error& e) {
      fail(option, ": expected none, selective, full or a comma-separated list of activation tags; ", e.what());
    }
  }
  return tags;
}

bool in_decoder_layer(ActivationTag tag) { return tag_sublayer(tag) != TagSublayer::head; }

}  // namespace

std::vector<ActivationTag> recompute_tags(const std::string& spec) {
  if (spec == "none") return {};
  if (spec == "selective")
    return tags_where([](ActivationTag t) {
      return tag_sublayer(t) == TagSublayer::ffn && t != ActivationTag::ffn_input && why_not_recomputable(t) == nullptr;
    });
  if (spec == "full") return tags_where([](ActivationTag t) { return why_not_recomputable(t) == nullptr; });
  return tag_list(spec, "--recompute");
}

std::vector<ActivationTag> swap_tags(const std::string& spec) {
  if (spec == "none") return {};
  if (spec == "selective")
    return tags_where([](ActivationTag t) {
      const TagKind kind = tag_kind(t);
      return in_decoder_layer(t) && (kind == TagKind::gemm || kind == TagKind::attention || kind == TagKind::exchanged);
    });
  if (spec == "full") return tags_where(in_decoder_layer);
  return tag_list(spec, "--swap");
}

void check_disjoint_policies(const std::string& recompute, const std::string& swap) {
  const std::vector<ActivationTag> recomputed = recompute_tags(recompute);
  for (ActivationTag tag : swap_tags(swap))
    if (std::find(recomputed.begin(), recomputed.end(), tag) != recomputed.end())
      fail("--swap ", swap, " and --recompute ", recompute, " both name ", activation_tag_name(tag),
           "; a tensor is either recomputed or swapped (name the tags of one of them)");
}

void apply_save_policies(ActivationStore& store, const std::string& recompute, const std::string& swap) {
  check_disjoint_policies(recompute, swap);
  for (int i = 0; i < kNumActivationTags; ++i) store.set_policy(static_cast<ActivationTag>(i), SavePolicy::keep);
  for (ActivationTag tag : recompute_tags(recompute)) {
    try {
      store.set_policy(tag, SavePolicy::recompute);
    } catch (const Error& e) {
      fail("--recompute ", recompute, ": ", e.what());
    }
  }
  for (ActivationTag tag : swap_tags(swap)) store.set_policy(tag, SavePolicy::swap);
}

}  // namespace trillion
