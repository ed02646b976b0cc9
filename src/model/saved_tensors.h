// Saved tensors, declared once per layer kind (docs/architecture.md, "Saved tensors"). Each kind
// defines, next to its forward and backward,
//
//   std::vector<SavedTensor> saved_tensors(const KindDims& dims, const SavedExtent& extent);
//
// listing every tensor its training forward saves, in the forward's order: the tag (whose element
// type the tag table gives: int32, or the model's floating type, memory/activation_tags.h), the shape from the kind's dimensions and the pass's extent, and
// whether this pass keeps it (the indexer's key statistics are kept only with its loss on; when not
// kept, the forward still writes the tensor, into its scratch). That one list gives
//   the forward's buffers:    SavedWriter saves(list, pass.store, layer, scratch);
//                             T* q = saves.out<T>(Tag::q);   // in the store, or scratch when
//                                                            // nothing is saved (store null)
//   the backward's tensors:   SavedReader saved(list, store, layer);
//                             const T* q = saved.in<T>(Tag::q);
//   the memory plan's bytes:  saved_sizes(list, element_bytes, bf16_operands).
// A tensor that only products read is declared an operand: under the bf16 precision the store may
// keep its bf16 rounding (ActivationStore::save_operand); out and in still give floats.
// Adding a saved tensor to a kind is one line in its saved_tensors and the out/in calls that use
// it; a new tag is one line in TRILLION_ACTIVATION_TAGS.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "memory/activation_store.h"
#include "memory/activation_tags.h"
#include "model/step.h"

namespace trillion {

// What a pass's saved tensors are sized by.
struct SavedExtent {
  int64_t batch = 0, seq = 0;
  int64_t routed_rows = -1;   // MoE: the routed rows its plan keeps (−1: their bound, as the memory plan counts)
  bool indexer_loss = false;  // sparse layers: the indexer's loss is on (its gradients are saved)
  bool indexer_sparse = true;  // sparse layers attend to the selected keys only (else densely)
  bool experts_exchanged = false;  // MoE: the routed rows run on their experts' owners (model/step.h)
  bool sequence_split = false;     // context parallelism: this rank holds part of every sequence
  // Under the exchange: the rows this rank's experts receive (−1: ⌈received_imbalance · routed rows⌉,
  // the memory plan's bound).
  int64_t received_rows = -1;
  double received_imbalance = 1.0;
  int64_t tokens() const { return batch * seq; }
  // A layer pass's extent (MoE sets the routed rows once its plan is built, the received rows once
  // the exchange knows them).
  static SavedExtent of(const LayerPass& pass) {
    return {.batch = pass.batch,
            .seq = pass.seq,
            .indexer_loss = pass.indexer != nullptr && pass.indexer->coef > 0.0,
            .indexer_sparse = pass.indexer == nullptr || pass.indexer->mode == IndexerMode::sparse,
            .experts_exchanged = pass.experts != nullptr,
            .sequence_split = pass.context != nullptr};
  }
};

struct SavedTensor {
  ActivationTag tag;
  Shape shape;
  bool kept = true;  // false: written by the forward as a temporary, never saved
  // Read only as an operand of products under the matmul precision (never by element-wise code,
  // float-operand products, or hand-written dots other than those that read the bf16 rounding under
  // the bf16 precision, as sparse attention's): with bf16 operands (ActivationStore::
  // set_bf16_operands) a float tensor's element type is bf16, its rounding.
  bool operand = false;
};

// How a part's backward reads its normed input h (model/sublayer_input.h), which each kind states
// beside its saved_tensors as input_use(dims): only as an operand of products (under the bf16
// precision the store may keep h's bf16 rounding), otherwise, or not at all (h is not kept).
enum class InputUse { operand, values, unread };

// Bytes of the saved tensors one training forward of a kind keeps, tag by tag.
struct SavedSize {
  ActivationTag tag;
  int64_t bytes;
  int64_t float_copy = 0;  // a bf16 operand's float copy while its part runs (the store's save_operand)
};

// Whether a saved tensor is kept as its bf16 rounding: a declared operand of a float model with bf16
// operands (ActivationStore::save_operand).
inline bool saved_as_bf16(const SavedTensor& s, int64_t element_bytes, bool bf16_operands) {
  return s.operand && bf16_operands && element_bytes == int64_t(sizeof(float)) &&
         tag_element(s.tag) == TagElement::real;
}

inline std::vector<SavedSize> saved_sizes(const std::vector<SavedTensor>& list, int64_t element_bytes,
                                          bool bf16_operands) {
  std::vector<SavedSize> sizes;
  for (const SavedTensor& s : list) {
    if (!s.kept) continue;
    const int64_t n = s.shape.numel();
    if (saved_as_bf16(s, element_bytes, bf16_operands)) {
      sizes.push_back({s.tag, n * int64_t(sizeof(bf16)), n * int64_t(sizeof(float))});
    } else {
      const bool integer = tag_element(s.tag) == TagElement::int32;
      sizes.push_back({s.tag, n * (integer ? int64_t(sizeof(int32_t)) : element_bytes)});
    }
  }
  return sizes;
}

namespace saved_detail {

inline const SavedTensor& find(const std::vector<SavedTensor>& list, ActivationTag tag) {
  const SavedTensor* found = nullptr;
  for (const SavedTensor& s : list)
    if (s.tag == tag) found = &s;
  TRILLION_CHECK(found != nullptr, "saved tensor ", activation_tag_name(tag), " is not in its layer kind's saved_tensors");
  return *found;
}

// E is int32_t for int32 tags and the model's floating type for every other.
template <class E>
void check_element(ActivationTag tag) {
  constexpr bool integer = std::is_same_v<E, int32_t>;
  TRILLION_CHECK((tag_element(tag) == TagElement::int32) == integer, "saved tensor ", activation_tag_name(tag),
                 ": element type does not match its tag's kind of element (int32 or floating)");
}

}  // namespace saved_detail

// The forward's side: where each declared tensor is written.
class SavedWriter {
 public:
  // store null: nothing is saved (evaluation), every tensor is a temporary of `scratch`.
  SavedWriter(std::vector<SavedTensor> list, ActivationStore* store, int layer, Arena& scratch)
      : list_(std::move(list)), store_(store), layer_(layer), scratch_(scratch) {}

  template <class E>
  E* out(ActivationTag tag) const {
    saved_detail::check_element<E>(tag);
    const SavedTensor& s = saved_detail::find(list_, tag);
    if (store_ == nullptr || !s.kept) return scratch_.alloc<E>(s.shape.numel());
    if constexpr (std::is_same_v<E, float>) {
      if (s.operand) return store_->save_operand(tag, layer_, s.shape);
    }
    return store_->save<E>(tag, layer_, s.shape);
  }

 private:
  std::vector<SavedTensor> list_;
  ActivationStore* store_;
  int layer_;
  Arena& scratch_;
};

// The backward's side: each declared tensor as the forward saved it.
class SavedReader {
 public:
  SavedReader(std::vector<SavedTensor> list, const ActivationStore& store, int layer)
      : list_(std::move(list)), store_(store), layer_(layer) {}

  template <class E>
  const E* in(ActivationTag tag) const {
    saved_detail::check_element<E>(tag);
    const SavedTensor& s = saved_detail::find(list_, tag);
    TRILLION_CHECK(s.kept, "saved tensor ", activation_tag_name(tag), " is not kept in this pass");
    return store_.get<E>(tag, layer_, s.shape.numel());
  }
  // The same, or null where the policy dropped a tensor its backward rebuilds and no re-run refilled it.
  template <class E>
  const E* in_or_rebuilt(ActivationTag tag) const {
    if (rebuilt_by_its_backward(tag) && store_.dropped(tag, layer_)) return nullptr;
    return in<E>(tag);
  }

 private:
  std::vector<SavedTensor> list_;
  const ActivationStore& store_;
  int layer_;
};

}  // namespace trillion
