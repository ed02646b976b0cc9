// Atomic file output and whole-file input (see atomic_file.h): the new contents go to
// "<path>.tmp.<pid>", are fsync'ed, renamed over <path>, and the directory is fsync'ed so the
// rename itself survives a crash. Every failure names the path and the system error.
#include "io/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace trillion {
namespace {

std::string errno_text() { return std::strerror(errno); }

// Writes all of `contents` to the open descriptor, retrying short writes and EINTR.
void write_all(int fd, std::string_view contents, const std::string& path) {
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t written = ::write(fd, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail(path, ": cannot write: ", errno_text());
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
}

}  // namespace

void sync_directory(const std::string& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(directory, ": cannot open directory to sync it: ", errno_text());
  int rc = ::fsync(fd);
  int saved_errno = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); the rename has still happened.
  if (rc != 0 && saved_errno != EINVAL) fail(directory, ": cannot fsync directory: ", std::strerror(saved_errno));
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  const std::string temp_path = str_cat(path, ".tmp.", ::getpid());
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, ": cannot create temporary file ", temp_path, ": ", errno_text());
  try {
    write_all(fd, contents, path);
    if (::fsync(fd) != 0) fail(path, ": cannot fsync ", temp_path, ": ", errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    std::string reason = errno_text();
    ::unlink(temp_path.c_str());
    fail(path, ": cannot close ", temp_path, ": ", reason);
  }
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    std::string reason = errno_text();
    ::unlink(temp_path.c_str());
    fail(path, ": cannot rename ", temp_path, " over it: ", reason);
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  sync_directory(parent.empty() ? std::string(".") : parent.string());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open for reading: ", errno_text());
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) fail(path, ": read error");
  return contents.str();
}

}  // namespace trillion
