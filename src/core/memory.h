// Tiered memory with byte accounting (docs/architecture.md, "Memory accounting").
//
// Tier::fast is RAM on CPU (HBM on an accelerator); Tier::slow is the swap tier (host / disk).
// Every large buffer is a Buffer<T> or comes from an Arena; both count their bytes in the global
// MemoryStats, which keep current and peak bytes per tier. Library buffers (OpenBLAS) fall outside,
// so the peak resident set size (VmHWM) is reported beside it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace trillion {

enum class Tier : int { fast = 0, slow = 1 };
constexpr int kNumTiers = 2;
const char* tier_name(Tier tier);

class MemoryStats {
 public:
  static void add(Tier tier, int64_t bytes);
  static void sub(Tier tier, int64_t bytes);
  static int64_t current(Tier tier);
  static int64_t peak(Tier tier);
  // Sets the peak to the current value (call at the start of a step to get per-step peaks).
  static void reset_peak(Tier tier);
};

// Peak and current resident set size of this process, from /proc/self/status (VmHWM, VmRSS).
int64_t peak_rss_bytes();
int64_t current_rss_bytes();
// Resets the peak resident set size to the current one (writes "5" to /proc/self/clear_refs), so a
// step's peak is its own and not start-up's; returns false where the kernel does not allow it (the
// peak then stays the process's).
bool reset_peak_rss();

// Raw 64-byte-aligned, zero-filled allocation counted against a tier. From 1 MiB on it is an
// anonymous mapping, whose pages become resident only when first touched.
void* tier_alloc(int64_t bytes, Tier tier);
void tier_free(void* p, int64_t bytes, Tier tier);

// Owning, zero-initialized, 64-byte-aligned array of T counted against a tier. Move-only.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t count, Tier tier = Tier::fast) : count_(count), tier_(tier) {
    if (count_ > 0) data_ = static_cast<T*>(tier_alloc(count_ * static_cast<int64_t>(sizeof(T)), tier_));
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
      tier_ = o.tier_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }
  void zero() {
    if (count_ > 0) std::memset(static_cast<void*>(data_), 0, count_ * sizeof(T));
  }
  Tensor<T> view(Shape shape) {
    TRILLION_CHECK(shape.numel() <= count_, "view ", shape.str(), " exceeds buffer of ", count_);
    return Tensor<T>(data_, shape);
  }

 private:
  void release() {
    if (data_ != nullptr) tier_free(data_, count_ * static_cast<int64_t>(sizeof(T)), tier_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  int64_t count_ = 0;
  Tier tier_ = Tier::fast;
};

// The system's memory page, in bytes (4096 on x86-64 Linux).
int64_t page_bytes();
// Whether a Buffer of `bytes` is a mapping of whole pages (tier_alloc: from 1 MiB on).
bool is_page_mapped(int64_t bytes);

// Whole pages of a page-mapped Buffer handed back to the system while their values live elsewhere
// (the frozen base's float weights, held in the parameters' bf16 copy: model/model_impl.h).
// madvise(MADV_DONTNEED) frees them and mprotect(PROT_NONE) makes any access fault, so a kernel that
// still reads them fails loudly instead of reading zeros. Out of the tier's bytes while released;
// restore() (or destruction, before the buffer is freed) maps them back, zero-filled and counted.
class ReleasedPages {
 public:
  ReleasedPages() = default;
  ~ReleasedPages() { restore(); }
  ReleasedPages(const ReleasedPages&) = delete;
  ReleasedPages& operator=(const ReleasedPages&) = delete;

  // Releases [begin, end) of a page-mapped buffer in `tier`; both page-aligned.
  void release(void* begin, void* end, Tier tier);
  void restore();
  int64_t bytes() const;  // released now

 private:
  struct Range {
    char* begin;
    int64_t bytes;
    Tier tier;
  };
  std::vector<Range> ranges_;
};

// Bump allocator for the activations of one step: alloc() hands out zero-filled, 64-byte-aligned
// slices of large blocks; reset() frees them all at once (the blocks are kept for the next step).
// Bytes in use are counted in MemoryStats while handed out.
class Arena {
 public:
  explicit Arena(Tier tier = Tier::fast, int64_t block_bytes = int64_t{64} << 20);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  template <class T>
  T* alloc(int64_t count) {
    return static_cast<T*>(alloc_bytes(count * static_cast<int64_t>(sizeof(T))));
  }
  template <class T>
  Tensor<T> tensor(Shape shape) {
    return Tensor<T>(alloc<T>(shape.numel()), shape);
  }
  void* alloc_bytes(int64_t bytes);
  void reset();
  int64_t used_bytes() const { return used_; }
  // `bytes` as alloc() takes them: rounded up to 64 bytes, an empty allocation taking 64.
  static int64_t rounded(int64_t bytes);

 private:
  struct Block {
    char* data;
    int64_t bytes;
  };
  Tier tier_;
  int64_t block_bytes_;
  std::vector<Block> blocks_;
  size_t current_block_ = 0;
  int64_t offset_ = 0;  // in blocks_[current_block_]
  int64_t used_ = 0;
};

}  // namespace trillion
