// PageArena: page-aligned spans in anonymous mappings, a coalescing best-fit free list, trim().
#include "memory/page_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <iterator>

#include "core/error.h"

namespace trillion {

PageArena::PageArena(int64_t block_bytes) : block_bytes_(rounded(block_bytes)) {}

PageArena::~PageArena() {
  for (Block& b : blocks_) munmap(b.data, static_cast<size_t>(b.bytes));
}

int64_t PageArena::page_bytes() {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  return page;
}

int64_t PageArena::rounded(int64_t bytes) {
  const int64_t page = page_bytes();
  return (bytes + page - 1) / page * page;
}

void PageArena::insert_free(char* span, int64_t bytes) {
  free_by_address_.emplace(span, bytes);
  free_by_size_.emplace(bytes, span);
}

void PageArena::erase_free(std::map<char*, int64_t>::iterator it) {
  auto [first, last] = free_by_size_.equal_range(it->second);
  for (auto s = first; s != last; ++s)
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  free_by_address_.erase(it);
}

PageArena::Block& PageArena::block_of(char* span) { return blocks_[std::prev(block_index_.upper_bound(span))->second]; }
const PageArena::Block& PageArena::block_of(char* span) const {
  return blocks_[std::prev(block_index_.upper_bound(span))->second];
}

std::multimap<int64_t, char*>::const_iterator PageArena::touched_fit(int64_t bytes) const {
  for (auto it = free_by_size_.lower_bound(bytes); it != free_by_size_.end(); ++it)
    if (it->second + bytes <= block_of(it->second).touched_end) return it;
  return free_by_size_.end();
}

// Best fit among the touched pages, then best fit anywhere, then a new block.
void* PageArena::alloc(int64_t bytes) {
  bytes = rounded(bytes > 0 ? bytes : 1);
  auto fit = touched_fit(bytes);
  if (fit == free_by_size_.end()) fit = free_by_size_.lower_bound(bytes);
  if (fit == free_by_size_.end()) {  // a new block, all free
    const int64_t size = bytes > block_bytes_ ? bytes : block_bytes_;
    void* data = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TRILLION_CHECK(data != MAP_FAILED, "out of memory: mapping ", size, " bytes for saved activations: ",
                   std::strerror(errno));
    blocks_.push_back({static_cast<char*>(data), size, static_cast<char*>(data)});
    block_index_.emplace(static_cast<char*>(data), blocks_.size() - 1);
    insert_free(static_cast<char*>(data), size);
    fit = free_by_size_.lower_bound(bytes);
  }
  char* span = fit->second;
  const int64_t size = fit->first;
  erase_free(free_by_address_.find(span));
  if (size > bytes) insert_free(span + bytes, size - bytes);
  Block& block = block_of(span);
  block.touched_end = std::max(block.touched_end, span + bytes);
  used_ += bytes;
  return span;
}

void PageArena::free(void* p, int64_t bytes) {
  char* span = static_cast<char*>(p);
  bytes = rounded(bytes > 0 ? bytes : 1);
  used_ -= bytes;
  const Block& block = block_of(span);
  char* block_start = block.data;
  char* block_end = block.data + block.bytes;
  auto next = free_by_address_.lower_bound(span);
  if (next != free_by_address_.end() && next->first == span + bytes && next->first < block_end) {
    bytes += next->second;
    erase_free(next);
  }
  auto prev = free_by_address_.lower_bound(span);
  if (prev != free_by_address_.begin()) {
    --prev;
    if (prev->first + prev->second == span && prev->first >= block_start) {
      span = prev->first;
      bytes += prev->second;
      erase_free(prev);
    }
  }
  insert_free(span, bytes);
}

void PageArena::reset() {
  free_by_address_.clear();
  free_by_size_.clear();
  for (const Block& b : blocks_) insert_free(b.data, b.bytes);
  used_ = 0;
}

void PageArena::trim() {
  TRILLION_CHECK(used_ == 0, "trim() with ", used_, " bytes in use");
  for (Block& b : blocks_) {
    const int rc = madvise(b.data, static_cast<size_t>(b.bytes), MADV_DONTNEED);
    TRILLION_CHECK(rc == 0, "madvise(MADV_DONTNEED) of ", b.bytes, " bytes failed: ", std::strerror(errno));
    b.touched_end = b.data;
  }
}

void PageArena::release_free() {
  for (const auto& [span, bytes] : free_by_address_) {
    char* end = std::min(span + bytes, block_of(span).touched_end);  // pages above were never touched
    if (end <= span) continue;
    const int rc = madvise(span, static_cast<size_t>(end - span), MADV_DONTNEED);
    TRILLION_CHECK(rc == 0, "madvise(MADV_DONTNEED) of ", end - span, " bytes failed: ", std::strerror(errno));
  }
}

int64_t PageArena::mapped_bytes() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

}  // namespace trillion
