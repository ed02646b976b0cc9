// Atomic file output: write to "<path>.tmp.<pid>", fsync, rename over <path> and fsync the
// directory, so a reader sees the old file or the new one, never half of one. Every step goes
// through the process-wide FileOutput (file_output.h), so tests can make any of them fail.
// AtomicFileWriter streams a file of any size in pieces; write_file_atomic writes one string.
#pragma once

#include <string>
#include <string_view>

#include "io/file_output.h"

namespace trillion {

// One atomically replaced file, written in any number of pieces:
//   AtomicFileWriter file(path);   // creates "<path>.tmp.<pid>"
//   file.write(bytes); ...         // appends
//   file.commit();                 // fsync + close + rename over path + fsync of the directory
// Every failure throws trillion::Error naming `path` and the step, and removes the temporary
// file, leaving whatever was at `path` before untouched (except a failed directory sync, which
// comes after the rename: the new file is in place but may not survive a crash). Destroying the
// writer without commit() (an exception in the caller) removes the temporary file as well.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::string_view bytes);
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  // Closes the temporary file if it is open and removes it (errors ignored: this is cleanup).
  void abandon();

  std::string path_;
  std::string temp_path_;
  FileOutput& output_;  // captured at construction: one file, one implementation
  int descriptor_ = -1;
  bool temp_exists_ = false;
};

// Writes `contents` to `path` atomically; throws trillion::Error naming the path on failure.
void write_file_atomic(const std::string& path, std::string_view contents);

// fsyncs a directory, so that a completed rename or creation inside it is durable; throws
// trillion::Error naming the directory on failure (a file system that refuses fsync on
// directories, EINVAL, is accepted).
void sync_directory(const std::string& directory);

// Removes `path` through the process-wide FileOutput if it exists; throws trillion::Error naming the
// path on any other failure.
void remove_file_if_present(const std::string& path);

// Reads a whole file; throws trillion::Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

}  // namespace trillion
