// Atomic file writes: contents replaced whole, no temporary file left behind, and failures that
// name the path (unwritable directory, missing file on read).
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;
using test::ScratchDir;

TEST(AtomicFile, WritesAndReplacesWholeFiles) {
  ScratchDir dir;
  const std::string path = dir.path("out.txt");
  write_file_atomic(path, "first version\n");
  EXPECT_EQ(read_file(path), "first version\n");
  write_file_atomic(path, std::string("second\0binary", 13));
  EXPECT_EQ(read_file(path), std::string("second\0binary", 13));
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(AtomicFile, ErrorsNameThePath) {
  ScratchDir dir;
  const std::string missing_dir_path = dir.path("no_such_dir/out.txt");
  std::string message = error_message([&] { write_file_atomic(missing_dir_path, "x"); });
  EXPECT_EQ(message.rfind(missing_dir_path + ": cannot create temporary file", 0), 0u) << message;

  const std::string missing = dir.path("missing.txt");
  message = error_message([&] { read_file(missing); });
  EXPECT_EQ(message.rfind(missing + ": cannot open for reading", 0), 0u) << message;

  // Renaming over a directory fails after the temporary was written: it must be cleaned up.
  std::filesystem::create_directory(dir.path("occupied"));
  std::filesystem::create_directory(dir.path("occupied/child"));
  message = error_message([&] { write_file_atomic(dir.path("occupied"), "x"); });
  EXPECT_NE(message.find(dir.path("occupied") + ": cannot rename"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(dir.path("occupied.tmp." + std::to_string(::getpid()))));
}

}  // namespace
}  // namespace trillion
