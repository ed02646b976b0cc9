// The activation tags' names, sublayers, kinds and element types, from the one list in activation_tags.h.
#include "memory/activation_tags.h"

#include "core/error.h"

namespace trillion {
namespace {

struct TagInfo {
  const char* name;
  TagSublayer sublayer;
  TagKind kind;
  TagElement element;
};

#define TRILLION_TAG_ROW(name, sublayer, kind, element) \
  {#name, TagSublayer::sublayer, TagKind::kind, TagElement::element},
constexpr TagInfo kTags[] = {TRILLION_ACTIVATION_TAGS(TRILLION_TAG_ROW)};
#undef TRILLION_TAG_ROW

const TagInfo& info(ActivationTag tag) {
  TRILLION_CHECK(tag != ActivationTag::count_, "count_ is not a tag");
  return kTags[static_cast<int>(tag)];
}

}  // namespace

const char* activation_tag_name(ActivationTag tag) { return info(tag).name; }
TagSublayer tag_sublayer(ActivationTag tag) { return info(tag).sublayer; }
TagKind tag_kind(ActivationTag tag) { return info(tag).kind; }
TagElement tag_element(ActivationTag tag) { return info(tag).element; }

bool rebuilt_by_its_backward(ActivationTag tag) {
  using Tag = ActivationTag;
  return tag == Tag::expert_gate_up || tag == Tag::expert_act || tag == Tag::ep_gate_up || tag == Tag::ep_act;
}

const char* why_not_recomputable(ActivationTag tag) {
  if (tag == ActivationTag::attn_input) return "it is the layer's recompute checkpoint";
  if (tag_sublayer(tag) == TagSublayer::head) return "the head is never re-run";
  if (tag_kind(tag) == TagKind::exchanged && !rebuilt_by_its_backward(tag))
    return "it came over the expert exchange, which a re-run does not repeat";
  return nullptr;
}

ActivationTag activation_tag_from_name(const std::string& name) {
  std::string names;
  for (int i = 0; i < kNumActivationTags; ++i) {
    if (name == kTags[i].name) return static_cast<ActivationTag>(i);
    names += (i ? ", " : "") + std::string(kTags[i].name);
  }
  fail("unknown activation tag \"", name, "\"; expected one of: ", names);
}

}  // namespace trillion
