// The tests' one helper for temporary directories: a ScratchDir is a fresh directory of its own
// under ::testing::TempDir() (TEST_TMPDIR, TMPDIR or /tmp/), made by mkdtemp so that no two tests
// or test processes share one, and removed with everything in it when it goes out of scope.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>     // mkdtemp
#include <sys/types.h>  // pid_t
#include <unistd.h>     // getpid

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace trillion::test {

class ScratchDir {
 public:
  // Named trillion_<label>_XXXXXX ('/' becomes '_'); without a label, after the running test
  // (suite_name).
  explicit ScratchDir(const std::string& label = "") {
    std::string name = "trillion_" + (label.empty() ? running_test_name() : label) + "_XXXXXX";
    for (char& c : name)
      if (c == '/') c = '_';
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / name).string();
    if (mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("cannot make a temporary directory " + pattern + ": " + std::strerror(errno));
    path_ = pattern;
  }
  // Removes the directory and its contents, in the process that made it only (a forked child that
  // exits, such as a death test's, leaves it to its parent).
  ~ScratchDir() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // The directory.
  const std::string& path() const { return path_; }
  // `name` (a file or subdirectory, not made here) inside the directory.
  std::string path(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  static std::string running_test_name() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return info == nullptr ? "test" : std::string(info->test_suite_name()) + "_" + info->name();
  }

  std::string path_;
  pid_t owner_ = ::getpid();
};

}  // namespace trillion::test
