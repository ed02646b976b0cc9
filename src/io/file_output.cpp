// File output through one replaceable interface (see file_output.h): the POSIX implementation,
// the process-wide current instance with its scoped override, and the fault-injecting wrapper
// that tests use to make the k-th open, write, fsync, close, rename or directory sync fail.
#include "io/file_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace trillion {
namespace {

// errno of the system call just made, or 0 when it succeeded.
int error_of(int result) { return result == 0 ? 0 : errno; }

std::atomic<FileOutput*> current_output{nullptr};

}  // namespace

const char* file_operation_name(FileOperation operation) {
  switch (operation) {
    case FileOperation::open: return "open";
    case FileOperation::write: return "write";
    case FileOperation::fsync: return "fsync";
    case FileOperation::close: return "close";
    case FileOperation::rename: return "rename";
    case FileOperation::sync_directory: return "sync_directory";
    case FileOperation::remove: return "remove";
    case FileOperation::make_directory: return "make_directory";
    case FileOperation::exchange: return "exchange";
  }
  return "?";
}

int write_all(FileOutput& output, int descriptor, const char* data, size_t size) {
  while (size > 0) {
    size_t written = 0;
    const int error = output.write_some(descriptor, data, size, &written);
    if (error == EINTR) continue;
    if (error != 0) return error;
    if (written == 0) return EIO;  // no progress on a regular file: give up rather than spin
    data += written;
    size -= written;
  }
  return 0;
}

int PosixFileOutput::open_for_writing(const std::string& path, int* descriptor) {
  *descriptor = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  return *descriptor < 0 ? errno : 0;
}

int PosixFileOutput::open_for_appending(const std::string& path, int* descriptor) {
  *descriptor = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  return *descriptor < 0 ? errno : 0;
}

int PosixFileOutput::write_some(int descriptor, const char* data, size_t size, size_t* written) {
  const ssize_t result = ::write(descriptor, data, size);
  *written = result < 0 ? 0 : static_cast<size_t>(result);
  return result < 0 ? errno : 0;
}

int PosixFileOutput::sync_file(int descriptor) { return error_of(::fsync(descriptor)); }

int PosixFileOutput::close_file(int descriptor) { return error_of(::close(descriptor)); }

int PosixFileOutput::rename_file(const std::string& from, const std::string& to) {
  return error_of(::rename(from.c_str(), to.c_str()));
}

int PosixFileOutput::sync_directory(const std::string& directory) {
  const int descriptor = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (descriptor < 0) return errno;
  const int error = error_of(::fsync(descriptor));
  ::close(descriptor);
  return error;
}

int PosixFileOutput::remove_file(const std::string& path) { return error_of(::unlink(path.c_str())); }

int PosixFileOutput::make_directory(const std::string& path) { return error_of(::mkdir(path.c_str(), 0755)); }

int PosixFileOutput::exchange(const std::string& a, const std::string& b) {
  return error_of(::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE));
}

PosixFileOutput& posix_file_output() {
  static PosixFileOutput instance;
  return instance;
}

FileOutput& file_output() {
  FileOutput* replacement = current_output.load();
  return replacement != nullptr ? *replacement : posix_file_output();
}

ScopedFileOutput::ScopedFileOutput(FileOutput& replacement) : previous_(current_output.exchange(&replacement)) {}

ScopedFileOutput::~ScopedFileOutput() { current_output.store(previous_); }

void FaultInjectingFileOutput::fail_nth(FileOperation operation, int64_t nth, int error) {
  TRILLION_CHECK(nth >= 1 && error != 0, "fail_nth needs nth >= 1 and an errno, got ", nth, " and ", error);
  fail_at_[index(operation)] = nth;
  fail_with_[index(operation)] = error;
}

void FaultInjectingFileOutput::limit_write_size(size_t max_bytes) {
  TRILLION_CHECK(max_bytes >= 1, "a write limit of 0 bytes would never finish");
  max_write_bytes_ = max_bytes;
}

int FaultInjectingFileOutput::injected_error(FileOperation operation) {
  const int64_t seen = ++counts_[index(operation)];
  return seen == fail_at_[index(operation)] ? fail_with_[index(operation)] : 0;
}

int FaultInjectingFileOutput::open_for_writing(const std::string& path, int* descriptor) {
  if (const int error = injected_error(FileOperation::open)) {
    *descriptor = -1;
    return error;
  }
  return target_.open_for_writing(path, descriptor);
}

int FaultInjectingFileOutput::open_for_appending(const std::string& path, int* descriptor) {
  if (const int error = injected_error(FileOperation::open)) {
    *descriptor = -1;
    return error;
  }
  return target_.open_for_appending(path, descriptor);
}

int FaultInjectingFileOutput::write_some(int descriptor, const char* data, size_t size, size_t* written) {
  *written = 0;
  if (const int error = injected_error(FileOperation::write)) return error;
  if (max_write_bytes_ != 0) size = std::min(size, max_write_bytes_);
  return target_.write_some(descriptor, data, size, written);
}

int FaultInjectingFileOutput::sync_file(int descriptor) {
  if (const int error = injected_error(FileOperation::fsync)) return error;
  return target_.sync_file(descriptor);
}

int FaultInjectingFileOutput::close_file(int descriptor) {
  // Like close(2) on Linux, a failed close still releases the descriptor.
  const int error = injected_error(FileOperation::close);
  const int target_error = target_.close_file(descriptor);
  return error != 0 ? error : target_error;
}

int FaultInjectingFileOutput::rename_file(const std::string& from, const std::string& to) {
  if (const int error = injected_error(FileOperation::rename)) return error;
  return target_.rename_file(from, to);
}

int FaultInjectingFileOutput::sync_directory(const std::string& directory) {
  if (const int error = injected_error(FileOperation::sync_directory)) return error;
  return target_.sync_directory(directory);
}

int FaultInjectingFileOutput::remove_file(const std::string& path) {
  if (const int error = injected_error(FileOperation::remove)) return error;
  return target_.remove_file(path);
}

int FaultInjectingFileOutput::make_directory(const std::string& path) {
  if (const int error = injected_error(FileOperation::make_directory)) return error;
  return target_.make_directory(path);
}

int FaultInjectingFileOutput::exchange(const std::string& a, const std::string& b) {
  if (const int error = injected_error(FileOperation::exchange)) return error;
  return target_.exchange(a, b);
}

}  // namespace trillion
