// Tier accounting, aligned allocation, per-step arenas and the OS view of resident memory.
#include "core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"

namespace trillion {
namespace {

std::atomic<int64_t> g_current[kNumTiers];
std::atomic<int64_t> g_peak[kNumTiers];

constexpr int64_t kAlign = 64;
// Allocations of at least this size are anonymous mappings: their pages read as zero without a
// zero-filling pass, and only the pages a step touches become resident (FSDP's flat buffers hold
// just the units in use, parallel/fsdp.h).
constexpr int64_t kMappedBytes = int64_t{1} << 20;

int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int64_t read_status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  }
  return 0;
}

}  // namespace

const char* tier_name(Tier tier) { return tier == Tier::fast ? "fast" : "slow"; }

void MemoryStats::add(Tier tier, int64_t bytes) {
  const int t = static_cast<int>(tier);
  const int64_t now = g_current[t].fetch_add(bytes) + bytes;
  int64_t peak = g_peak[t].load();
  while (now > peak && !g_peak[t].compare_exchange_weak(peak, now)) {
  }
}
void MemoryStats::sub(Tier tier, int64_t bytes) { g_current[static_cast<int>(tier)].fetch_sub(bytes); }
int64_t MemoryStats::current(Tier tier) { return g_current[static_cast<int>(tier)].load(); }
int64_t MemoryStats::peak(Tier tier) { return g_peak[static_cast<int>(tier)].load(); }
void MemoryStats::reset_peak(Tier tier) { g_peak[static_cast<int>(tier)].store(current(tier)); }

int64_t peak_rss_bytes() { return read_status_kib("VmHWM"); }
int64_t current_rss_bytes() { return read_status_kib("VmRSS"); }

bool reset_peak_rss() {
  std::FILE* file = std::fopen("/proc/self/clear_refs", "w");
  if (file == nullptr) return false;
  const bool written = std::fputs("5", file) >= 0;
  return std::fclose(file) == 0 && written;
}

void* tier_alloc(int64_t bytes, Tier tier) {
  void* p = nullptr;
  if (bytes >= kMappedBytes) {
    p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(kAlign, round_up(bytes));
    if (p != nullptr) std::memset(p, 0, bytes);
  }
  if (p == nullptr) fail("out of memory allocating ", bytes, " bytes in tier ", tier_name(tier));
  MemoryStats::add(tier, bytes);
  return p;
}

void tier_free(void* p, int64_t bytes, Tier tier) {
  if (bytes >= kMappedBytes) {
    munmap(p, static_cast<size_t>(bytes));
  } else {
    std::free(p);
  }
  MemoryStats::sub(tier, bytes);
}

int64_t page_bytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

bool is_page_mapped(int64_t bytes) { return bytes >= kMappedBytes; }

void ReleasedPages::release(void* begin, void* end, Tier tier) {
  char* first = static_cast<char*>(begin);
  const int64_t bytes = static_cast<char*>(end) - first;
  TRILLION_CHECK(bytes > 0 && reinterpret_cast<uintptr_t>(first) % page_bytes() == 0 && bytes % page_bytes() == 0,
                 "released pages must be whole pages, got ", bytes, " bytes");
  if (madvise(first, static_cast<size_t>(bytes), MADV_DONTNEED) != 0 ||
      mprotect(first, static_cast<size_t>(bytes), PROT_NONE) != 0)
    fail("releasing ", bytes, " bytes of pages failed");
  ranges_.push_back({first, bytes, tier});
  MemoryStats::sub(tier, bytes);
}

void ReleasedPages::restore() {
  for (const Range& range : ranges_) {
    TRILLION_CHECK(mprotect(range.begin, static_cast<size_t>(range.bytes), PROT_READ | PROT_WRITE) == 0,
                   "restoring ", range.bytes, " bytes of released pages failed");
    MemoryStats::add(range.tier, range.bytes);
  }
  ranges_.clear();
}

int64_t ReleasedPages::bytes() const {
  int64_t total = 0;
  for (const Range& range : ranges_) total += range.bytes;
  return total;
}

Arena::Arena(Tier tier, int64_t block_bytes) : tier_(tier), block_bytes_(block_bytes) {}

Arena::~Arena() {
  reset();
  for (Block& b : blocks_) std::free(b.data);
}

int64_t Arena::rounded(int64_t bytes) { return round_up(bytes > 0 ? bytes : kAlign); }

void* Arena::alloc_bytes(int64_t bytes) {
  bytes = rounded(bytes);
  while (current_block_ < blocks_.size() && offset_ + bytes > blocks_[current_block_].bytes) {
    ++current_block_;
    offset_ = 0;
  }
  if (current_block_ == blocks_.size()) {
    const int64_t size = bytes > block_bytes_ ? bytes : block_bytes_;
    char* data = static_cast<char*>(std::aligned_alloc(kAlign, size));
    TRILLION_CHECK(data != nullptr, "out of memory: arena block of ", size, " bytes");
    blocks_.push_back({data, size});
    offset_ = 0;
  }
  char* p = blocks_[current_block_].data + offset_;
  offset_ += bytes;
  used_ += bytes;
  std::memset(p, 0, bytes);
  MemoryStats::add(tier_, bytes);
  return p;
}

void Arena::reset() {
  MemoryStats::sub(tier_, used_);
  used_ = 0;
  current_block_ = 0;
  offset_ = 0;
}

}  // namespace trillion
