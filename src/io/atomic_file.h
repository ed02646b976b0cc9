// Atomic file output: write to "<path>.tmp.<pid>", fsync, rename over <path> and fsync the
// directory, so a reader sees the old file or the new one, never half of one.
#pragma once

#include <string>
#include <string_view>

namespace trillion {

// Writes `contents` to `path` atomically; throws trillion::Error naming the path on failure.
void write_file_atomic(const std::string& path, std::string_view contents);

// fsyncs a directory, so that a completed rename or creation inside it is durable; throws
// trillion::Error naming the directory on failure (a file system that refuses fsync on
// directories, EINVAL, is accepted).
void sync_directory(const std::string& directory);

// Reads a whole file; throws trillion::Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

}  // namespace trillion
