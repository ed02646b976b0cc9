// ActivationStore: the one place where modules keep the activations their backward needs, and where
// the memory policy is applied (docs/architecture.md, "Saved tensors": keep, recompute or swap per
// saved tensor). Each saved tensor is an entry keyed by a static tag (memory/activation_tags.h) and
// a layer index (the head's final norm and loss use layer L, the number of decoder layers), with its
// dtype and shape.
//
// The store sees each layer's life through events the layer loops send, per part: a decoder
// layer's mixer sublayer and its FFN sublayer (the tags' TagSublayer), the head (layer L) as one.
//   end_forward(l, part, backward_next)
//                       the part's entries are complete (the completion point: modules fill what
//                       save() returned until their part's forward ends); entries whose tag is swap
//                       are queued for the slow tier (their pages are reused once written; the
//                       writes of earlier parts are waited for first, so the writer is at most one
//                       part behind), those whose tag is recompute are dropped (their pages reused
//                       at once). backward_next: l's backward is the next to run (the last decoder
//                       layer, the head), so its swap entries stay resident: their write and read
//                       would overlap nothing (as Transformer Engine offloads at most L − 1 layers);
//   begin_recompute(l) … end_recompute()
//                       the model re-runs the sublayers that own dropped entries; save() refills a
//                       dropped entry in place and hands out a throwaway buffer for every other
//                       (so kept tensors are never written twice);
//   begin_backward(l, part) … end_backward(l, part)
//                       one part of the backward: a decoder layer's FFN part (with its recompute
//                       before it), then its mixer part. begin makes the part's entries resident
//                       (waiting if need be; the FFN part also gets the recompute checkpoint when
//                       the mixer is re-run) and queues the prefetch of the next part's, to overlap
//                       this part's compute (an entry whose pages were not reused yet is taken back
//                       as it is, without reading); end frees the part's entries, so their pages
//                       take the next part's prefetch.
// Entries of 64 KiB and more live in page spans that are reused as soon as they are free
// (PageArena), so resident memory follows what is live at once; smaller ones (statistics, tiny
// models) stay until clear(), whatever their tag's policy. A change of policy trims the free pages.
// Every byte an entry holds in the fast tier is counted in MemoryStats; the slow tier counts
// what is in the swap file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "memory/activation_tags.h"
#include "memory/page_arena.h"
#include "memory/swap_engine.h"
#include "ops/gemm.h"

namespace trillion {

enum class SavePolicy { keep, recompute, swap };
const char* save_policy_name(SavePolicy policy);

enum class SavedType { f32, f64, i32, bf16 };
template <class T>
constexpr SavedType saved_type_of();
template <>
constexpr SavedType saved_type_of<float>() { return SavedType::f32; }
template <>
constexpr SavedType saved_type_of<double>() { return SavedType::f64; }
template <>
constexpr SavedType saved_type_of<int32_t>() { return SavedType::i32; }
template <>
constexpr SavedType saved_type_of<bf16>() { return SavedType::bf16; }
const char* saved_type_name(SavedType type);

// What the store has done since it was made (cumulative: callers take differences per step).
struct StoreCounters {
  int64_t saved_bytes = 0;        // saved in forward (every policy)
  int64_t dropped_bytes = 0;      // dropped after forward for recompute
  int64_t recomputed_bytes = 0;   // refilled by recompute
  int64_t swapped_out_bytes = 0;  // written to the slow tier
  int64_t read_back_bytes = 0;    // read back from it
  int64_t swap_reused_bytes = 0;  // swapped out but still in memory when needed: used without a read
  double swap_wait_seconds = 0.0;  // the main thread waiting on swap I/O
};

class ActivationStore {
 public:
  // Entries below this size stay resident until clear() (tests lower it to reach tiny models').
  static constexpr int64_t kPagedMinBytes = int64_t{64} << 10;
  void set_paged_min_bytes(int64_t bytes) { paged_min_bytes_ = bytes; }
  // Whether an entry of `bytes` is paged (follows its policy) under that threshold, and the
  // fast-tier bytes it holds: its own when paged, the small arena's rounding of them otherwise.
  static bool is_paged(int64_t bytes, int64_t min_bytes) { return bytes >= min_bytes && bytes > 0; }
  static int64_t held_bytes(int64_t bytes, int64_t min_bytes) {
    return is_paged(bytes, min_bytes) ? bytes : Arena::rounded(bytes);
  }

  ActivationStore();
  ~ActivationStore();
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  // The policy of every entry saved under `tag` from the next step on. attn_input (the layer's
  // recompute checkpoint), the head's tags and the exchanged ones cannot be recompute. swap needs set_swap_directory.
  void set_policy(ActivationTag tag, SavePolicy policy);
  SavePolicy policy(ActivationTag tag) const { return policies_[static_cast<int>(tag)]; }
  // Where the swap file goes (a directory on local disk); buffered: never O_DIRECT (tests).
  void set_swap_directory(const std::string& directory, bool buffered = false);
  const SwapEngine* swap_engine() const { return swap_.get(); }
  // Synchronous swap: end_forward waits for its layer's writes and frees their pages at once, so
  // every swapped tensor is read back (tests of the read path; normally writes overlap compute).
  void set_swap_synchronous(bool synchronous) { swap_synchronous_ = synchronous; }
  // Lossy swap: float32 tensors go to the file as bfloat16 (half the bytes; off by default).
  void set_swap_bf16(bool bf16) { swap_bf16_ = bf16; }
  // Product operands in bf16 (on by default): under the bf16 matmul precision, a float tensor that
  // only products read (save_operand) is kept as its bf16 rounding, all that those products read of
  // it: the same results in half the bytes. Off: kept in float (comparisons).
  void set_bf16_operands(bool bf16) { bf16_operands_ = bf16; }

  // Storage for (tag, layer), zero-filled; the caller writes it until end_forward(layer).
  // CHECK-fails if (tag, layer) is already saved in this step (outside recompute).
  template <class T>
  T* save(ActivationTag tag, int layer, const Shape& shape) {
    return static_cast<T*>(save_bytes(tag, layer, saved_type_of<T>(), shape, sizeof(T)));
  }
  template <class T>
  T* save(ActivationTag tag, int layer, int64_t count) {
    return save<T>(tag, layer, Shape{count});
  }
  // The saved tensor; CHECK-fails if absent, of another type or size, or not resident.
  template <class T>
  const T* get(ActivationTag tag, int layer, int64_t count) const {
    if constexpr (std::is_same_v<T, float>) {
      if (const float* values = float_copy(tag, layer, count)) return values;
    }
    return static_cast<const T*>(get_bytes(tag, layer, saved_type_of<T>(), count * static_cast<int64_t>(sizeof(T))));
  }
  // Storage for a float tensor that only products under the matmul precision read, as save<float>
  // gives it (zero-filled); with bf16 operands under the bf16 precision the entry holds its bf16 rounding instead: the caller writes a
  // float staging copy, rounded into the entry when its part's forward (or recompute) ends. Reading
  // it back (get<float>) gives the rounding widened to float, registered as its bf16 copy
  // (ops/gemm.h), so the products read the entry itself; that view lives until its part's backward
  // ends. Both float copies are counted in the fast tier while they live.
  float* save_operand(ActivationTag tag, int layer, const Shape& shape);
  bool contains(ActivationTag tag, int layer) const { return entries_.count({layer, static_cast<int>(tag)}) != 0; }
  Shape shape(ActivationTag tag, int layer) const;
  struct EntryInfo {
    ActivationTag tag;
    SavedType type;
    Shape shape;
    int64_t bytes;
  };
  // The entries saved under `layer` in this step, in tag order (for the memory plan's tests).
  std::vector<EntryInfo> entries(int layer) const;

  // Layer events (see the file comment). `part` is TagSublayer::mixer or ffn for a decoder layer,
  // head for layer L.
  void end_forward(int layer, TagSublayer part, bool backward_next = false);
  // Whether recompute must re-run `sublayer` of `layer`: some dropped entry (not yet refilled)
  // asks for it (recompute_reruns).
  bool reruns(int layer, TagSublayer sublayer) const;
  bool dropped(ActivationTag tag, int layer) const;
  void begin_recompute(int layer);
  void end_recompute();
  void begin_backward(int layer, TagSublayer part);
  void end_backward(int layer, TagSublayer part);

  // Gives the pages no entry holds back to the operating system: called when the forward ends, so
  // the pages recompute and swap freed do not stay resident through the loss and the backward's
  // first layers (keep-all frees none, so it costs nothing there).
  void release_free_pages() {
    pages_.release_free();
    float_pages_.release_free();
  }
  // Frees every saved tensor (end of step; waits for swap I/O in flight).
  void clear();
  int64_t bytes_in_use() const;  // fast-tier bytes the entries hold now
  int64_t num_saved() const { return static_cast<int64_t>(entries_.size()); }
  StoreCounters counters() const;

 private:
  enum class State { writing, complete, swapped_out, reading, dropped, consumed };
  struct Entry {
    char* data = nullptr;
    int64_t bytes = 0;
    SavedType type = SavedType::f32;
    Shape shape;
    bool paged = false;        // in pages_ (follows its policy) or in small_
    bool held = false;         // paged and data holds a span of pages_
    State state = State::writing;
    int64_t swap_offset = -1;  // in the swap file, once written
    bool swap_bf16 = false;    // written as bfloat16
    SwapEngine::Ticket ticket = 0;  // of the last swap job
  };
  using Key = std::pair<int, int>;  // (layer, tag): a layer's entries are contiguous
  // The float values of a bf16 operand entry: the forward's staging (not registered) or the
  // backward's widened view (registered as the entry's bf16 copy).
  struct FloatCopy {
    char* data = nullptr;
    int64_t bytes = 0;
    std::unique_ptr<RegisteredBf16Copy> registration;
  };
  char* take_float_span(int64_t bytes) const;  // a span of float_pages_, counted in the fast tier
  // The float values of (tag, layer) if it is a bf16 operand entry (its staging, or its view, made
  // on first read), else null.
  const float* float_copy(ActivationTag tag, int layer, int64_t count) const;
  // Rounds the staging copy of a bf16 operand entry into it and frees the copy.
  void round_staged(const Key& key, Entry& entry);
  void free_float_copy(const Key& key);
  void* save_bytes(ActivationTag tag, int layer, SavedType type, const Shape& shape, int64_t element_bytes);
  const void* get_bytes(ActivationTag tag, int layer, SavedType type, int64_t bytes) const;
  char* take_span(int64_t bytes);  // a span of pages_, counted in the fast tier
  void free_span(Entry& entry);     // the entry's span back to pages_
  void reclaim_written();           // frees the spans whose swap writes are done
  void bring_back(Entry& entry);    // a swapped-out entry: reused as it is, or a read queued
  template <class F>
  void for_layer(int layer, F&& f);
  // Calls f on each entry of `part` of `layer`: its sublayer's, plus attn_input for the FFN part
  // when the mixer is re-run (recompute, before the FFN's backward, starts from it).
  template <class F>
  void for_part(int layer, TagSublayer part, F&& f);

  SavePolicy policies_[kNumActivationTags] = {};
  std::map<Key, Entry> entries_;
  PageArena pages_;
  Arena small_;
  Arena throwaway_;  // what save() hands out for kept entries during recompute
  int recompute_layer_ = -1;
  int64_t paged_min_bytes_ = kPagedMinBytes;
  bool swap_synchronous_ = false;
  bool swap_bf16_ = false;
  bool bf16_operands_ = true;
  // The float copies of bf16 operand entries, made and freed within one part (a cache of the
  // entries for the backward's reads: hence mutable).
  mutable std::map<Key, FloatCopy> float_copies_;
  mutable PageArena float_pages_;
  std::unique_ptr<SwapEngine> swap_;
  int64_t swap_offset_ = 0;  // next free byte of the swap file in this step
  std::vector<Entry*> writes_in_flight_;  // swapped out, span still held
  StoreCounters counters_;
};

}  // namespace trillion
