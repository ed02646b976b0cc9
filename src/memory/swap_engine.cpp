// SwapEngine: one background thread writing saved activations to an unlinked file and reading them back.
#include "memory/swap_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "io/half_float.h"
#include "memory/page_arena.h"

namespace trillion {
namespace {

// Opens a fresh file in `directory` and unlinks it; O_DIRECT first when asked, buffered otherwise.
int open_unlinked(const std::string& directory, bool try_direct, bool& direct) {
  std::string pattern = directory + "/trillion-swap-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) fail("swap directory ", directory, ": cannot create a swap file: ", std::strerror(errno));
  unlink(name.data());
  direct = false;
  if (try_direct) {
    const int flags = fcntl(fd, F_GETFL);
    direct = flags >= 0 && fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
  }
  return fd;
}

}  // namespace

SwapEngine::SwapEngine(const std::string& directory, Io io) : directory_(directory) {
  fd_ = open_unlinked(directory, io == Io::automatic, direct_);
  worker_ = std::thread([this] { run(); });
}

SwapEngine::~SwapEngine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
  close(fd_);
  if (staging_ != nullptr) MemoryStats::sub(Tier::fast, kStagingBytes);
}

SwapEngine::Ticket SwapEngine::write_out(void* span, int64_t bytes, int64_t offset, bool bf16) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back({true, static_cast<char*>(span), bytes, offset, bf16});
  changed_.notify_all();
  return ++queued_;
}

SwapEngine::Ticket SwapEngine::read_in(void* span, int64_t bytes, int64_t offset, bool bf16) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back({false, static_cast<char*>(span), bytes, offset, bf16});
  changed_.notify_all();
  return ++queued_;
}

void SwapEngine::wait(Ticket ticket) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= ticket; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!error_.empty()) fail(error_);
}

bool SwapEngine::done(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ >= ticket;
}

void SwapEngine::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= queued_; });
  error_.clear();
}

int64_t SwapEngine::bytes_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_;
}

int64_t SwapEngine::bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_read_;
}

void SwapEngine::run() {
  for (;;) {
    Job job;
    bool skip;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      job = queue_.front();
      queue_.pop_front();
      skip = !error_.empty();  // after a failure nothing more is trusted
    }
    std::string error;
    if (!skip) {
      try {
        execute(job);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty() && !error.empty()) error_ = error;
      if (!skip && error.empty()) (job.write ? bytes_written_ : bytes_read_) += job.bytes;
      ++done_;
    }
    changed_.notify_all();
  }
}

int64_t SwapEngine::file_bytes(int64_t bytes, bool bf16) {
  if (!bf16) return PageArena::rounded(bytes);
  const int64_t floats = bytes / 4, per_chunk = kStagingBytes / 2;  // bf16 values per staging chunk
  const int64_t full = floats / per_chunk, rest = floats % per_chunk;
  return full * kStagingBytes + PageArena::rounded(rest * 2);
}

// pwrite / pread of whole pages (short transfers continue; an error or end of file fails), then the
// page-cache upkeep of the file comment.
void SwapEngine::transfer(bool write, char* data, int64_t bytes, int64_t offset) {
  bytes = PageArena::rounded(bytes);
  const char* what = write ? "write" : "read";
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = write ? pwrite(fd_, data + done, static_cast<size_t>(bytes - done), offset + done)
                            : pread(fd_, data + done, static_cast<size_t>(bytes - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail("swap file in ", directory_, ": ", what, " of ", bytes, " bytes at offset ", offset, " failed: ",
           n < 0 ? std::strerror(errno) : "unexpected end of file");
    done += n;
  }
  if (!direct_) {
    if (write && sync_file_range(fd_, offset, bytes,
                                 SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
      fail("swap file in ", directory_, ": syncing ", bytes, " bytes at offset ", offset, " failed: ", std::strerror(errno));
    posix_fadvise(fd_, offset, bytes, POSIX_FADV_DONTNEED);  // advisory: the bytes are already safe
  }
}

// Raw: the span itself. bf16: chunk by chunk through the staging buffer (its tail zero-padded to a page).
void SwapEngine::execute(const Job& job) {
  if (!job.bf16) return transfer(job.write, job.span, job.bytes, job.offset);
  if (staging_ == nullptr) {
    staging_ = static_cast<char*>(staging_pages_.alloc(kStagingBytes));
    MemoryStats::add(Tier::fast, kStagingBytes);
  }
  auto* values = reinterpret_cast<float*>(job.span);
  auto* staged = reinterpret_cast<uint16_t*>(staging_);
  const int64_t floats = job.bytes / 4, per_chunk = kStagingBytes / 2;
  for (int64_t first = 0, offset = job.offset; first < floats; first += per_chunk, offset += kStagingBytes) {
    const int64_t count = std::min(per_chunk, floats - first);
    if (job.write) {
      for (int64_t i = 0; i < count; ++i) staged[i] = bf16_from_double(values[first + i]);
      std::memset(staged + count, 0, static_cast<size_t>(PageArena::rounded(count * 2) - count * 2));
      transfer(true, staging_, count * 2, offset);
    } else {
      transfer(false, staging_, count * 2, offset);
      for (int64_t i = 0; i < count; ++i) values[first + i] = static_cast<float>(bf16_to_double(staged[i]));
    }
  }
}

}  // namespace trillion
