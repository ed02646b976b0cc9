// ActivationStore: saved activations with their policy applied at the layer events (see the header).
#include "memory/activation_store.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace trillion {

const char* save_policy_name(SavePolicy policy) {
  switch (policy) {
    case SavePolicy::keep: return "keep";
    case SavePolicy::recompute: return "recompute";
    case SavePolicy::swap: return "swap";
  }
  return "?";
}

const char* saved_type_name(SavedType type) {
  switch (type) {
    case SavedType::f32: return "float32";
    case SavedType::f64: return "float64";
    case SavedType::i32: return "int32";
    case SavedType::bf16: return "bfloat16";
  }
  return "?";
}

ActivationStore::ActivationStore() : small_(Tier::fast, int64_t{4} << 20), throwaway_(Tier::fast) {}

ActivationStore::~ActivationStore() { clear(); }

void ActivationStore::set_policy(ActivationTag tag, SavePolicy policy) {
  if (policy == SavePolicy::recompute)
    if (const char* why = why_not_recomputable(tag)) fail("activation ", activation_tag_name(tag), " cannot be recomputed: ", why);
  TRILLION_CHECK(entries_.empty(), "policies are set between steps");
  if (policies_[static_cast<int>(tag)] != policy) {  // the new policy's peak may be lower
    pages_.trim();
    float_pages_.trim();
  }
  policies_[static_cast<int>(tag)] = policy;
}

void ActivationStore::set_swap_directory(const std::string& directory, bool buffered) {
  TRILLION_CHECK(entries_.empty(), "the swap directory is set between steps");
  swap_ = std::make_unique<SwapEngine>(directory, buffered ? SwapEngine::Io::buffered : SwapEngine::Io::automatic);
}

template <class F>
void ActivationStore::for_layer(int layer, F&& f) {
  for (auto it = entries_.lower_bound({layer, 0}); it != entries_.end() && it->first.first == layer; ++it)
    f(static_cast<ActivationTag>(it->first.second), it->second);
}

template <class F>
void ActivationStore::for_part(int layer, TagSublayer part, F&& f) {
  const bool checkpoint = part == TagSublayer::ffn && reruns(layer, TagSublayer::mixer);
  for_layer(layer, [&](ActivationTag tag, Entry& e) {
    if (tag_sublayer(tag) == part || (checkpoint && tag == ActivationTag::attn_input)) f(tag, e);
  });
}

void* ActivationStore::save_bytes(ActivationTag tag, int layer, SavedType type, const Shape& shape,
                                  int64_t element_bytes) {
  TRILLION_CHECK(tag != ActivationTag::count_, "count_ is not a tag");
  const int64_t bytes = shape.numel() * element_bytes;
  const Key key{layer, static_cast<int>(tag)};
  const auto it = entries_.find(key);
  if (recompute_layer_ >= 0) {
    TRILLION_CHECK(layer == recompute_layer_ && it != entries_.end(), "recompute of layer ", recompute_layer_,
                   " saved ", activation_tag_name(tag), " of layer ", layer, ", which its forward did not save");
    Entry& e = it->second;
    TRILLION_CHECK(e.bytes == bytes && e.type == type, "recompute saved ", activation_tag_name(tag), " of layer ", layer,
                   " with another type or size than its forward");
    if (e.state != State::dropped) return throwaway_.alloc_bytes(bytes);  // kept: never written twice
    e.data = take_span(e.bytes);
    e.held = true;
    e.state = State::writing;
    counters_.recomputed_bytes += e.bytes;
    return e.data;
  }
  TRILLION_CHECK(it == entries_.end(), "activation ", activation_tag_name(tag), " of layer ", layer,
                 " saved twice in one step");
  Entry e;
  e.bytes = bytes;
  e.type = type;
  e.shape = shape;
  e.paged = is_paged(bytes, paged_min_bytes_);
  if (e.paged) {
    e.data = take_span(bytes);
    e.held = true;
  } else {
    e.data = static_cast<char*>(small_.alloc_bytes(bytes));  // zero-filled and counted by the arena
  }
  counters_.saved_bytes += bytes;
  return entries_.emplace(key, e).first->second.data;
}

float* ActivationStore::save_operand(ActivationTag tag, int layer, const Shape& shape) {
  if (!bf16_operands_ || matmul_precision() != MatmulPrecision::bf16) return save<float>(tag, layer, shape);
  const Key key{layer, static_cast<int>(tag)};
  const int64_t float_bytes = shape.numel() * int64_t(sizeof(float));
  if (recompute_layer_ >= 0) {  // kept: never written twice (save_bytes checks the rest)
    const auto it = entries_.find(key);
    if (it != entries_.end() && it->second.state != State::dropped && it->second.type == SavedType::bf16 &&
        it->second.shape.numel() == shape.numel())
      return static_cast<float*>(throwaway_.alloc_bytes(float_bytes));
  }
  save_bytes(tag, layer, SavedType::bf16, shape, sizeof(bf16));  // the entry, or its refill in place
  FloatCopy& staging = float_copies_[key];
  TRILLION_CHECK(staging.data == nullptr, "activation ", activation_tag_name(tag), " of layer ", layer,
                 " staged twice");
  staging.data = take_float_span(float_bytes);
  staging.bytes = float_bytes;
  return reinterpret_cast<float*>(staging.data);
}

char* ActivationStore::take_float_span(int64_t bytes) const {
  char* span = static_cast<char*>(float_pages_.alloc(bytes));
  std::memset(span, 0, static_cast<size_t>(bytes));  // as save() hands out its storage
  MemoryStats::add(Tier::fast, bytes);
  return span;
}

const float* ActivationStore::float_copy(ActivationTag tag, int layer, int64_t count) const {
  const Key key{layer, static_cast<int>(tag)};
  const auto entry = entries_.find(key);
  if (entry == entries_.end() || entry->second.type != SavedType::bf16) return nullptr;
  TRILLION_CHECK(!omp_in_parallel(), "activation ", activation_tag_name(tag), " read inside a parallel region");
  TRILLION_CHECK(entry->second.shape.numel() == count, "activation ", activation_tag_name(tag), " of layer ", layer,
                 " has ", entry->second.shape.numel(), " elements, read as ", count);
  const auto found = float_copies_.find(key);
  if (found != float_copies_.end()) return reinterpret_cast<const float*>(found->second.data);
  const bf16* rounded = static_cast<const bf16*>(get_bytes(tag, layer, SavedType::bf16, count * int64_t(sizeof(bf16))));
  FloatCopy& view = float_copies_[key];
  view.bytes = count * int64_t(sizeof(float));
  view.data = take_float_span(view.bytes);
  float* values = reinterpret_cast<float*>(view.data);  // [count]
  to_float_threaded(rounded, values, count);
  view.registration = std::make_unique<RegisteredBf16Copy>(values, rounded, count);
  return values;
}

void ActivationStore::round_staged(const Key& key, Entry& e) {
  const auto found = float_copies_.find(key);
  if (found == float_copies_.end() || found->second.registration != nullptr) return;
  to_bf16_threaded(reinterpret_cast<const float*>(found->second.data), reinterpret_cast<bf16*>(e.data),
                   e.shape.numel());
  free_float_copy(key);
}

void ActivationStore::free_float_copy(const Key& key) {
  const auto found = float_copies_.find(key);
  if (found == float_copies_.end()) return;
  found->second.registration.reset();
  float_pages_.free(found->second.data, found->second.bytes);
  MemoryStats::sub(Tier::fast, found->second.bytes);
  float_copies_.erase(found);
}

const void* ActivationStore::get_bytes(ActivationTag tag, int layer, SavedType type, int64_t bytes) const {
  const auto it = entries_.find({layer, static_cast<int>(tag)});
  TRILLION_CHECK(it != entries_.end(), "activation ", activation_tag_name(tag), " of layer ", layer,
                 " was not saved");
  const Entry& e = it->second;
  TRILLION_CHECK(e.type == type, "activation ", activation_tag_name(tag), " of layer ", layer, " is ",
                 saved_type_name(e.type), ", read as ", saved_type_name(type));
  TRILLION_CHECK(e.bytes == bytes, "activation ", activation_tag_name(tag), " of layer ", layer, " has ", e.bytes,
                 " bytes, expected ", bytes);
  TRILLION_CHECK(e.state == State::writing || e.state == State::complete, "activation ", activation_tag_name(tag),
                 " of layer ", layer, " is not resident (",
                 e.state == State::dropped    ? "dropped for recompute"
                 : e.state == State::consumed ? "consumed by its backward"
                                              : "swapped out",
                 ")");
  return e.data;
}

std::vector<ActivationStore::EntryInfo> ActivationStore::entries(int layer) const {
  std::vector<EntryInfo> infos;
  for (auto it = entries_.lower_bound({layer, 0}); it != entries_.end() && it->first.first == layer; ++it)
    infos.push_back({static_cast<ActivationTag>(it->first.second), it->second.type, it->second.shape, it->second.bytes});
  return infos;
}

Shape ActivationStore::shape(ActivationTag tag, int layer) const {
  const auto it = entries_.find({layer, static_cast<int>(tag)});
  TRILLION_CHECK(it != entries_.end(), "activation ", activation_tag_name(tag), " of layer ", layer, " was not saved");
  return it->second.shape;
}

// Free pages first: while swap writes are in flight, the forward waits for the oldest rather than
// map new pages, so the writer's lag never grows resident memory.
char* ActivationStore::take_span(int64_t bytes) {
  reclaim_written();
  while (!pages_.fits_touched(bytes) && !writes_in_flight_.empty()) {
    swap_->wait(writes_in_flight_.front()->ticket);
    reclaim_written();
  }
  char* span = static_cast<char*>(pages_.alloc(bytes));
  std::memset(span, 0, static_cast<size_t>(bytes));
  MemoryStats::add(Tier::fast, bytes);
  return span;
}

void ActivationStore::free_span(Entry& e) {
  pages_.free(e.data, e.bytes);
  MemoryStats::sub(Tier::fast, e.bytes);
  e.data = nullptr;
  e.held = false;
}

void ActivationStore::reclaim_written() {
  size_t kept = 0;
  for (Entry* e : writes_in_flight_) {
    if (swap_->done(e->ticket)) {
      free_span(*e);  // only the file's copy is left
      MemoryStats::add(Tier::slow, SwapEngine::file_bytes(e->bytes, e->swap_bf16));
    } else {
      writes_in_flight_[kept++] = e;
    }
  }
  writes_in_flight_.resize(kept);
}

// The writer may be one part behind, never more (the memory plan counts on it): the writes still in
// flight from earlier parts are waited for before this part's are queued.
void ActivationStore::end_forward(int layer, TagSublayer part, bool backward_next) {
  for (Entry* e : writes_in_flight_) swap_->wait(e->ticket);
  if (!writes_in_flight_.empty()) reclaim_written();
  for_layer(layer, [&](ActivationTag tag, Entry& e) {
    if (tag_sublayer(tag) != part || e.state != State::writing) return;
    const Key key{layer, static_cast<int>(tag)};
    e.state = State::complete;
    const SavePolicy applied = !e.paged ? SavePolicy::keep
                               : backward_next && policy(tag) == SavePolicy::swap ? SavePolicy::keep
                                                                                   : policy(tag);
    if (applied == SavePolicy::recompute) {
      free_float_copy(key);  // dropped: recompute stages and rounds it again
    } else {
      round_staged(key, e);
    }
    if (!e.paged) return;
    switch (applied) {
      case SavePolicy::keep: break;
      case SavePolicy::recompute:
        free_span(e);
        e.state = State::dropped;
        counters_.dropped_bytes += e.bytes;
        break;
      case SavePolicy::swap:
        TRILLION_CHECK(swap_ != nullptr, "swap policy for ", activation_tag_name(tag), " without a swap directory");
        e.swap_offset = swap_offset_;
        e.swap_bf16 = swap_bf16_ && e.type == SavedType::f32;
        swap_offset_ += SwapEngine::file_bytes(e.bytes, e.swap_bf16);
        e.ticket = swap_->write_out(e.data, e.bytes, e.swap_offset, e.swap_bf16);
        e.state = State::swapped_out;
        writes_in_flight_.push_back(&e);
        counters_.swapped_out_bytes += e.bytes;
        if (swap_synchronous_) swap_->wait(e.ticket);
        break;
    }
  });
  if (swap_synchronous_ && swap_ != nullptr) reclaim_written();
}

bool ActivationStore::reruns(int layer, TagSublayer sublayer) const {
  for (auto it = entries_.lower_bound({layer, 0}); it != entries_.end() && it->first.first == layer; ++it)
    if (it->second.state == State::dropped && recompute_reruns(static_cast<ActivationTag>(it->first.second), sublayer))
      return true;
  return false;
}

bool ActivationStore::dropped(ActivationTag tag, int layer) const {
  const auto it = entries_.find({layer, static_cast<int>(tag)});
  return it != entries_.end() && it->second.state == State::dropped;
}

void ActivationStore::begin_recompute(int layer) {
  TRILLION_CHECK(recompute_layer_ < 0, "recompute of layer ", layer, " inside that of layer ", recompute_layer_);
  recompute_layer_ = layer;
}

void ActivationStore::end_recompute() {
  for_layer(recompute_layer_, [&](ActivationTag tag, Entry& e) {
    if (e.state != State::writing) return;
    round_staged({recompute_layer_, static_cast<int>(tag)}, e);
    e.state = State::complete;
  });
  recompute_layer_ = -1;
  throwaway_.reset();
}

void ActivationStore::bring_back(Entry& e) {
  if (e.state != State::swapped_out) return;
  if (e.held) {  // its pages were not reused yet: they still hold the tensor
    writes_in_flight_.erase(std::find(writes_in_flight_.begin(), writes_in_flight_.end(), &e));
    e.state = State::complete;
    counters_.swap_reused_bytes += e.bytes;
    return;
  }
  e.data = take_span(e.bytes);
  e.held = true;
  e.ticket = swap_->read_in(e.data, e.bytes, e.swap_offset, e.swap_bf16);
  e.state = State::reading;
  counters_.read_back_bytes += e.bytes;
}

void ActivationStore::begin_backward(int layer, TagSublayer part) {
  for_part(layer, part, [&](ActivationTag, Entry& e) { bring_back(e); });
  for_part(layer, part, [&](ActivationTag, Entry& e) {
    if (e.state != State::reading) return;
    swap_->wait(e.ticket);
    MemoryStats::sub(Tier::slow, SwapEngine::file_bytes(e.bytes, e.swap_bf16));
    e.state = State::complete;
  });
  // The next part in backward order: a layer's mixer after its FFN, then the FFN of the layer below.
  if (part == TagSublayer::ffn) {
    for_part(layer, TagSublayer::mixer, [&](ActivationTag, Entry& e) { bring_back(e); });
  } else if (layer > 0) {
    for_part(layer - 1, TagSublayer::ffn, [&](ActivationTag, Entry& e) { bring_back(e); });
  }
}

void ActivationStore::end_backward(int layer, TagSublayer part) {
  for_layer(layer, [&](ActivationTag tag, Entry& e) {
    if (tag_sublayer(tag) != part) return;
    TRILLION_CHECK(e.state == State::complete || e.state == State::dropped, "end_backward of layer ", layer,
                   " with its activation ", activation_tag_name(tag), " not resident");
    free_float_copy({layer, static_cast<int>(tag)});
    if (e.held) {
      if (e.ticket != 0) swap_->wait(e.ticket);  // a write of a reused entry may still read its span
      free_span(e);
    }
    e.state = State::consumed;
  });
  if (part != TagSublayer::ffn) entries_.erase(entries_.lower_bound({layer, 0}), entries_.lower_bound({layer + 1, 0}));
}

void ActivationStore::clear() {
  if (swap_ != nullptr) swap_->drain();
  while (!float_copies_.empty()) free_float_copy(float_copies_.begin()->first);
  for (auto& [key, e] : entries_) {
    if (e.held) MemoryStats::sub(Tier::fast, e.bytes);
    const bool in_file = (e.state == State::swapped_out && !e.held) || e.state == State::reading;
    if (in_file) MemoryStats::sub(Tier::slow, SwapEngine::file_bytes(e.bytes, e.swap_bf16));
  }
  writes_in_flight_.clear();
  entries_.clear();
  pages_.reset();
  float_pages_.reset();
  small_.reset();
  throwaway_.reset();
  recompute_layer_ = -1;
  swap_offset_ = 0;
}

int64_t ActivationStore::bytes_in_use() const {
  int64_t bytes = small_.used_bytes();
  for (const auto& [key, e] : entries_)
    if (e.held) bytes += e.bytes;
  return bytes;
}

StoreCounters ActivationStore::counters() const {
  StoreCounters c = counters_;
  if (swap_ != nullptr) c.swap_wait_seconds = swap_->wait_seconds();
  return c;
}

}  // namespace trillion
