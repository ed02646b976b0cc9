// Shared by the libFuzzer targets (fuzz/*_fuzz.cpp): the parsers under test read files, so each
// input is written to a file in a per-process scratch directory (in /dev/shm when it exists), and
// bad input must end in a trillion::Error; anything else (a crash, a sanitizer report, another
// exception, a CHECK) is a bug the fuzzer reports.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace trillion::fuzz {

// This process's scratch directory, created once.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm") : std::filesystem::temp_directory_path();
    std::filesystem::path made = base / ("trillion_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(made);
    return made;
  }();
  return dir;
}

// Writes data[size] to `name` in the scratch directory (below `subdir` if given); returns its path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name, const std::string& subdir = "") {
  const std::filesystem::path dir = subdir.empty() ? scratch_dir() : scratch_dir() / subdir;
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  return path;
}

}  // namespace trillion::fuzz
