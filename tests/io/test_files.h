// Helpers for tests that write files: a scratch directory removed at the end of the test, raw
// byte writes, and capture of the message of an expected trillion::Error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace trillion::testing {

// A fresh directory under the system temporary directory, named after the running test.
class ScratchDir {
 public:
  ScratchDir() {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            str_cat("trillion_", test->test_suite_name(), "_", test->name(), "_", ::getpid());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A safetensors file from a header text and data bytes (the header length is the text's size).
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  return std::string(reinterpret_cast<const char*>(&length), 8) + header + data;
}

// Runs `action`, which must throw trillion::Error, and returns the message ("" and a test
// failure if it does not throw).
template <class Action>
std::string error_message(Action&& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a trillion::Error";
  return "";
}

}  // namespace trillion::testing
