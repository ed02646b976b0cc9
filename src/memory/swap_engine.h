// The slow tier on CPU: saved activations copied to a file on local disk by one background thread
// and read back before their layer's backward (docs/architecture.md, "Saved tensors": swap offloads
// in the background during forward and prefetches in reverse layer order during backward).
//
// The file is created in a directory the user names and unlinked at once (nothing is left behind,
// even after a crash). It is opened with O_DIRECT where the file system allows it, so its bytes
// never enter the page cache; otherwise each write is synced (sync_file_range) and its range
// dropped from the page cache (posix_fadvise DONTNEED), and so is each read. Either way the swapped
// bytes leave memory: the file's pages are not cached, and the caller reuses the tensor's own pages
// once done() says the write is complete.
//
// On request a float32 tensor is stored as bfloat16 (lossy: rounded to nearest even; half the bytes
// and the disk time), converted through a 1 MiB staging buffer by the worker.
//
// Spans must be page-aligned and cover whole pages (PageArena's); offsets are the caller's. Jobs
// run in the order they are queued; an I/O error (a full disk) fails every later wait with a
// message naming the file, the bytes and the offset, so a failed swap is an error, never a wrong
// result.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "memory/page_arena.h"

namespace trillion {

class SwapEngine {
 public:
  enum class Io { automatic, buffered };  // automatic: O_DIRECT where the file system allows it
  explicit SwapEngine(const std::string& directory, Io io = Io::automatic);
  ~SwapEngine();
  SwapEngine(const SwapEngine&) = delete;
  SwapEngine& operator=(const SwapEngine&) = delete;

  using Ticket = int64_t;
  // Copies span[0, bytes) to the file at `offset` (bf16: the span's floats as bfloat16); the span
  // must stay untouched until done().
  Ticket write_out(void* span, int64_t bytes, int64_t offset, bool bf16 = false);
  // Reads what write_out wrote at `offset` back into the span.
  Ticket read_in(void* span, int64_t bytes, int64_t offset, bool bf16 = false);
  // The file bytes a tensor of `bytes` takes (whole pages; bf16: half, per staging chunk).
  static int64_t file_bytes(int64_t bytes, bool bf16);
  static constexpr int64_t kStagingBytes = int64_t{1} << 20;
  // Whether the job is done (never blocks).
  bool done(Ticket ticket) const;
  // Blocks until the job is done (time counted in wait_seconds); fails if any job so far failed.
  void wait(Ticket ticket);
  // Blocks until every queued job is done, without failing; forgets a failure (a new step starts).
  void drain();

  bool direct_io() const { return direct_; }
  int64_t bytes_written() const;
  int64_t bytes_read() const;
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Job {
    bool write;
    char* span;
    int64_t bytes;
    int64_t offset;
    bool bf16;
  };
  void run();
  void execute(const Job& job);
  void transfer(bool write, char* data, int64_t bytes, int64_t offset);  // whole pages, then page-cache upkeep

  std::string directory_;
  int fd_ = -1;
  bool direct_ = false;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  Ticket queued_ = 0, done_ = 0;
  std::string error_;  // the first failure since the last drain
  bool stopping_ = false;
  int64_t bytes_written_ = 0, bytes_read_ = 0;
  double wait_seconds_ = 0.0;  // main thread only
  char* staging_ = nullptr;    // [kStagingBytes], page-aligned, made by the first bf16 job (worker only)
  PageArena staging_pages_{kStagingBytes};
  std::thread worker_;
};

}  // namespace trillion
