// The one door through which trillion writes files: create a file (or open one to append to),
// write bytes, fsync it, close it, rename it, fsync a directory, remove a file, create a directory, exchange two paths.
// Everything that must survive a crash (atomic files, safetensors, checkpoints) goes through the
// process-wide FileOutput, so a test can swap in one that fails:
//   - PosixFileOutput: the real system calls (the default);
//   - FaultInjectingFileOutput: forwards to another FileOutput, counts every operation by kind
//     and makes the k-th one of a kind fail with a chosen errno (ENOSPC, EIO), or makes every
//     write short so that callers must retry;
//   - ScopedFileOutput: installs a replacement for the lifetime of a scope.
// The operations are system-call sized and report failure as an errno value instead of throwing:
// the caller (AtomicFileWriter in atomic_file.h) knows which file the user asked for, so it
// builds the trillion::Error message and removes its temporary file. The crash-point harness
// (io/crash_points.h) is one more FileOutput: it counts operations like FaultInjectingFileOutput,
// stops the process after the k-th one and can forget the bytes written since a file's last fsync.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace trillion {

// The kinds of operation a FileOutput performs (what fault injection counts and fails).
enum class FileOperation { open, write, fsync, close, rename, sync_directory, remove, make_directory, exchange };
constexpr int kNumFileOperations = 9;
const char* file_operation_name(FileOperation operation);  // "open", "write", …, "sync_directory"

// Every operation returns 0 on success or the errno value of its failure.
class FileOutput {
 public:
  virtual ~FileOutput() = default;
  // Creates `path` (or truncates it) for writing, mode 0644; sets *descriptor.
  virtual int open_for_writing(const std::string& path, int* descriptor) = 0;
  // Opens an existing `path` for writing at its end (O_APPEND); sets *descriptor. Counted as an open.
  virtual int open_for_appending(const std::string& path, int* descriptor) = 0;
  // Writes up to `size` bytes and sets *written to how many were written (possibly fewer: a
  // short write, which the caller retries with the rest).
  virtual int write_some(int descriptor, const char* data, size_t size, size_t* written) = 0;
  virtual int sync_file(int descriptor) = 0;  // fsync
  virtual int close_file(int descriptor) = 0;
  virtual int rename_file(const std::string& from, const std::string& to) = 0;
  // fsyncs a directory so that renames and creations inside it are durable.
  virtual int sync_directory(const std::string& directory) = 0;
  virtual int remove_file(const std::string& path) = 0;
  virtual int make_directory(const std::string& path) = 0;  // mode 0755; EEXIST if it exists
  // Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE).
  virtual int exchange(const std::string& a, const std::string& b) = 0;
};

// Writes all of `data`, retrying short writes and EINTR; returns 0 or the errno of the failure.
int write_all(FileOutput& output, int descriptor, const char* data, size_t size);

// The real file system.
class PosixFileOutput : public FileOutput {
 public:
  int open_for_writing(const std::string& path, int* descriptor) override;
  int open_for_appending(const std::string& path, int* descriptor) override;
  int write_some(int descriptor, const char* data, size_t size, size_t* written) override;
  int sync_file(int descriptor) override;
  int close_file(int descriptor) override;
  int rename_file(const std::string& from, const std::string& to) override;
  int sync_directory(const std::string& directory) override;
  int remove_file(const std::string& path) override;
  int make_directory(const std::string& path) override;
  int exchange(const std::string& a, const std::string& b) override;
};

// The process-wide instance every file writer uses: the PosixFileOutput unless a
// ScopedFileOutput has replaced it.
FileOutput& file_output();
PosixFileOutput& posix_file_output();

// Makes `replacement` the process-wide FileOutput until the end of the scope, then restores the
// previous one (scopes nest). Writers capture the instance when they open a file.
class ScopedFileOutput {
 public:
  explicit ScopedFileOutput(FileOutput& replacement);
  ~ScopedFileOutput();
  ScopedFileOutput(const ScopedFileOutput&) = delete;
  ScopedFileOutput& operator=(const ScopedFileOutput&) = delete;

 private:
  FileOutput* previous_;
};

// Forwards every operation to `target` and counts it by kind; an operation chosen by
// fail_nth() is not forwarded but reports the chosen errno instead. Not thread-safe: one writer
// at a time, as in tests.
class FaultInjectingFileOutput : public FileOutput {
 public:
  explicit FaultInjectingFileOutput(FileOutput& target = posix_file_output()) : target_(target) {}
  // The `nth` (1-based, counted from construction) operation of `operation` kind fails with
  // `error`; one failure per kind (a later call replaces it).
  void fail_nth(FileOperation operation, int64_t nth, int error);
  // Every write hands at most `max_bytes` (>= 1) to the target: a short write for larger ones.
  void limit_write_size(size_t max_bytes);
  // Operations of `operation` kind seen so far (failed ones included).
  int64_t count(FileOperation operation) const { return counts_[index(operation)]; }

  int open_for_writing(const std::string& path, int* descriptor) override;
  int open_for_appending(const std::string& path, int* descriptor) override;
  int write_some(int descriptor, const char* data, size_t size, size_t* written) override;
  int sync_file(int descriptor) override;
  int close_file(int descriptor) override;
  int rename_file(const std::string& from, const std::string& to) override;
  int sync_directory(const std::string& directory) override;
  int remove_file(const std::string& path) override;
  int make_directory(const std::string& path) override;
  int exchange(const std::string& a, const std::string& b) override;

 private:
  static size_t index(FileOperation operation) { return static_cast<size_t>(operation); }
  // Counts one operation of this kind; returns the injected errno when it is the chosen one.
  int injected_error(FileOperation operation);

  FileOutput& target_;
  std::array<int64_t, kNumFileOperations> counts_{};
  std::array<int64_t, kNumFileOperations> fail_at_{};  // 0: never
  std::array<int, kNumFileOperations> fail_with_{};
  size_t max_write_bytes_ = 0;  // 0: no limit
};

}  // namespace trillion
