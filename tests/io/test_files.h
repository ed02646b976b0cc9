// Helpers for tests that write files: raw byte writes, and capture of the message of an expected
// trillion::Error. (Their scratch directories are test::ScratchDir, test_support/scratch_dir.h.)
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "core/error.h"

namespace trillion::testing {

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
