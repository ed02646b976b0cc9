// Page-granular storage for saved activations, whose spans are freed in the middle of a step
// (dropped for recompute, swapped to the slow tier, consumed by backward) and reused at once.
//
// Blocks are anonymous private mappings; every span starts on a page and covers whole pages. A
// freed span returns to a free list (coalesced with free neighbours in its block) and the next
// alloc() takes the smallest free span that fits, so the layers of a step, whose saved tensors have
// the same sizes, reuse each other's pages: resident memory follows the bytes live at once, not
// the bytes saved in the step, and reused pages cost no page faults. trim() gives every page
// back to the operating system (madvise MADV_DONTNEED). Accounting is the caller's (the activation
// store counts the bytes it holds in MemoryStats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace trillion {

class PageArena {
 public:
  explicit PageArena(int64_t block_bytes = int64_t{256} << 20);
  ~PageArena();
  PageArena(const PageArena&) = delete;
  PageArena& operator=(const PageArena&) = delete;

  static int64_t page_bytes();
  // `bytes` rounded up to whole pages.
  static int64_t rounded(int64_t bytes);
  // A span of rounded(bytes) bytes starting on a page; its contents are whatever its pages last held.
  void* alloc(int64_t bytes);
  // Whether alloc(bytes) would find room among the pages already touched (no new resident memory).
  bool fits_touched(int64_t bytes) const { return touched_fit(rounded(bytes)) != free_by_size_.end(); }
  // Returns a span alloc() gave (with the same `bytes`) to the free list.
  void free(void* span, int64_t bytes);
  // Frees every span at once (the pages stay mapped and resident for the next step).
  void reset();
  // Gives every page back to the operating system (nothing may be in use).
  void trim();
  // Gives the pages of the free spans back (they fault in again, zeroed, when next handed out).
  void release_free();
  int64_t mapped_bytes() const;
  int64_t used_bytes() const { return used_; }

 private:
  struct Block {
    char* data;
    int64_t bytes;
    char* touched_end;  // every page below it was handed out at least once
  };
  Block& block_of(char* span);
  const Block& block_of(char* span) const;
  // The smallest free span holding `bytes` below its block's touched_end, or end().
  std::multimap<int64_t, char*>::const_iterator touched_fit(int64_t bytes) const;
  void insert_free(char* span, int64_t bytes);
  void erase_free(std::map<char*, int64_t>::iterator it);
  int64_t block_bytes_;
  std::vector<Block> blocks_;
  std::map<char*, int64_t> free_by_address_;      // span → bytes
  std::multimap<int64_t, char*> free_by_size_;    // bytes → span
  std::map<char*, size_t> block_index_;           // block start → index in blocks_ (spans never cross blocks)
  int64_t used_ = 0;
};

}  // namespace trillion
