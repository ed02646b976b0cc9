// PageArena: page-aligned spans, reuse of freed spans (coalesced), trim() giving pages back.
#include "memory/page_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/memory.h"

namespace trillion {
namespace {

TEST(PageArena, SpansArePageAlignedAndFreedSpansAreReused) {
  PageArena arena(int64_t{1} << 20);
  const int64_t page = PageArena::page_bytes();
  char* a = static_cast<char*>(arena.alloc(100));
  char* b = static_cast<char*>(arena.alloc(3 * page + 1));
  char* c = static_cast<char*>(arena.alloc(page));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % page, 0u);
  EXPECT_EQ(b, a + page);            // 100 bytes take one page
  EXPECT_EQ(c, b + 4 * page);        // 3 pages + 1 byte take four
  EXPECT_EQ(arena.used_bytes(), 6 * page);
  arena.free(b, 3 * page + 1);
  EXPECT_EQ(arena.alloc(2 * page), b);  // the smallest touched free span that fits
  arena.free(a, 100);
  arena.free(b, 2 * page);
  // a, b and the page after b coalesce into one span of four pages before c.
  EXPECT_EQ(arena.alloc(4 * page), a);
  EXPECT_EQ(arena.used_bytes(), 5 * page);
  arena.reset();
  EXPECT_EQ(arena.used_bytes(), 0);
  EXPECT_EQ(arena.alloc(page), a);
}

TEST(PageArena, LargeSpansGetTheirOwnBlock) {
  PageArena arena(int64_t{1} << 20);
  void* big = arena.alloc(int64_t{3} << 20);
  EXPECT_NE(big, nullptr);
  EXPECT_GE(arena.mapped_bytes(), int64_t{3} << 20);
  EXPECT_FALSE(arena.fits_touched(int64_t{1} << 20));  // the block's pages were all handed out once...
  arena.free(big, int64_t{3} << 20);
  EXPECT_TRUE(arena.fits_touched(int64_t{1} << 20));   // ...and are free again
}

// Touching 64 MiB raises resident memory by about that much; trim() gives it back.
TEST(PageArena, TrimReturnsResidentMemory) {
  const int64_t bytes = int64_t{64} << 20;
  PageArena arena(bytes);
  char* span = static_cast<char*>(arena.alloc(bytes));
  const int64_t before = current_rss_bytes();
  std::memset(span, 1, bytes);
  const int64_t touched = current_rss_bytes();
  EXPECT_GE(touched - before, bytes * 9 / 10);
  arena.free(span, bytes);
  EXPECT_GE(current_rss_bytes(), touched - bytes / 10);  // free keeps the pages for reuse
  arena.trim();
  EXPECT_LE(current_rss_bytes(), touched - bytes * 9 / 10);
  EXPECT_FALSE(arena.fits_touched(PageArena::page_bytes()));
}

// release_free() gives back the free spans' pages only: the live span keeps its contents.
TEST(PageArena, ReleaseFreeKeepsLiveSpans) {
  const int64_t bytes = int64_t{32} << 20;
  PageArena arena(2 * bytes);
  char* live = static_cast<char*>(arena.alloc(bytes));
  char* freed = static_cast<char*>(arena.alloc(bytes));
  std::memset(live, 3, bytes);
  std::memset(freed, 4, bytes);
  arena.free(freed, bytes);
  const int64_t before = current_rss_bytes();
  arena.release_free();
  EXPECT_LE(current_rss_bytes(), before - bytes * 9 / 10);
  EXPECT_EQ(live[bytes - 1], 3);
  char* again = static_cast<char*>(arena.alloc(bytes));
  EXPECT_EQ(again, freed);
  EXPECT_EQ(again[12345], 0);  // released pages read as zeros
}

}  // namespace
}  // namespace trillion
