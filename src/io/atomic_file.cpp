// Atomic file output and whole-file input (see atomic_file.h): the new contents go to
// "<path>.tmp.<pid>", are fsync'ed, renamed over <path>, and the directory is fsync'ed so the
// rename itself survives a crash. Every step goes through file_output(); every failure names the
// path and the system error and removes the temporary file.
#include "io/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace trillion {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void sync_directory_through(FileOutput& output, const std::string& directory) {
  const int error = output.sync_directory(directory);
  // Some file systems refuse fsync on directories (EINVAL); the rename has still happened.
  if (error != 0 && error != EINVAL) fail(directory, ": cannot fsync directory: ", std::strerror(error));
}

}  // namespace

void sync_directory(const std::string& directory) { sync_directory_through(file_output(), directory); }

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), temp_path_(str_cat(path, ".tmp.", ::getpid())), output_(file_output()) {
  const int error = output_.open_for_writing(temp_path_, &descriptor_);
  if (error != 0) {
    descriptor_ = -1;
    fail(path_, ": cannot create temporary file ", temp_path_, ": ", std::strerror(error));
  }
  temp_exists_ = true;
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() {
  if (descriptor_ >= 0) output_.close_file(descriptor_);
  descriptor_ = -1;
  if (temp_exists_) output_.remove_file(temp_path_);
  temp_exists_ = false;
}

void AtomicFileWriter::write(std::string_view bytes) {
  TRILLION_CHECK(descriptor_ >= 0, path_, ": write after commit or after a failure");
  const int error = write_all(output_, descriptor_, bytes.data(), bytes.size());
  if (error != 0) {
    abandon();
    fail(path_, ": cannot write: ", std::strerror(error));
  }
}

void AtomicFileWriter::commit() {
  TRILLION_CHECK(descriptor_ >= 0, path_, ": commit after commit or after a failure");
  int error = output_.sync_file(descriptor_);
  if (error != 0) {
    abandon();
    fail(path_, ": cannot fsync ", temp_path_, ": ", std::strerror(error));
  }
  error = output_.close_file(std::exchange(descriptor_, -1));
  if (error != 0) {
    abandon();
    fail(path_, ": cannot close ", temp_path_, ": ", std::strerror(error));
  }
  error = output_.rename_file(temp_path_, path_);
  if (error != 0) {
    abandon();
    fail(path_, ": cannot rename ", temp_path_, " over it: ", std::strerror(error));
  }
  temp_exists_ = false;
  sync_directory_through(output_, parent_directory(path_));
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFileWriter file(path);
  file.write(contents);
  file.commit();
}

void remove_file_if_present(const std::string& path) {
  const int error = file_output().remove_file(path);
  if (error != 0 && error != ENOENT) fail(path, ": cannot remove: ", std::strerror(error));
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
