// write_checkpoint through the file-output interface: the directory creation, every file's
// operations, the rename of a new checkpoint and the exchange with an existing one of the same step
// each fail in turn (fault injection); each failure names the path, leaves no temporary directory,
// and `latest` names a complete checkpoint: the previous one when the failure comes before the new
// one is in place, as it was.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/atomic_file.h"
#include "io/file_output.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"
#include "train/checkpoint.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using test::ScratchDir;

// A checkpoint of one file whose contents say which attempt wrote it.
std::string write_one(const std::string& out, int64_t step, const std::string& contents) {
  return write_checkpoint(out, step, [&](const std::string& temp_dir) {
    write_file_atomic((fs::path(temp_dir) / "weights.txt").string(), contents);
  });
}

size_t entries_in(const std::string& directory) {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(directory)) ++count;
  return count;
}

TEST(CheckpointDirectory, EveryFailureKeepsThePreviousCheckpoint) {
  for (const int64_t step : {2, 1}) {  // 2: a new checkpoint (rename); 1: the same step again (exchange)
    ScratchDir dir;
    const std::string out = dir.path();
    write_one(out, 1, "first\n");
    FaultInjectingFileOutput counter;
    {
      ScopedFileOutput scope(counter);
      write_one(out, step, "counted\n");
    }
    const FileOperation last_step = step == 1 ? FileOperation::exchange : FileOperation::rename;
    for (FileOperation operation : {FileOperation::make_directory, FileOperation::open, FileOperation::write,
                                    FileOperation::fsync, last_step}) {
      ASSERT_GE(counter.count(operation), 1) << file_operation_name(operation);
      for (int64_t nth = 1; nth <= counter.count(operation); ++nth) {
        SCOPED_TRACE(str_cat("step ", step, " ", file_operation_name(operation), " #", nth));
        // Back to one checkpoint of step 1 (the counted run may have added or replaced one).
        fs::remove_all(out);
        fs::create_directories(out);
        write_one(out, 1, "first\n");
        FaultInjectingFileOutput output;
        output.fail_nth(operation, nth, operation == FileOperation::write ? ENOSPC : EIO);
        const std::string message = [&] {
          ScopedFileOutput scope(output);
          return error_message([&] { write_one(out, step, "second\n"); });
        }();
        EXPECT_NE(message.find(out), std::string::npos) << message;
        EXPECT_NE(message.find(std::strerror(operation == FileOperation::write ? ENOSPC : EIO)), std::string::npos)
            << message;
        // No temporary is left, and `latest` names a complete checkpoint: the previous one, or (when
        // only the update of `latest` failed) the new one, in place whole.
        for (const auto& entry : fs::directory_iterator(out))
          EXPECT_NE(entry.path().filename().string()[0], '.') << "left behind: " << entry.path();
        const std::string latest = read_file((fs::path(out) / "latest").string());
        const std::string weights = read_file((fs::path(out) / latest.substr(0, latest.size() - 1) / "weights.txt").string());
        EXPECT_TRUE(weights == "first\n" || weights == "second\n") << weights;
        if (operation == FileOperation::make_directory || nth == 1) {  // before the new checkpoint is in place
          EXPECT_EQ(read_file((fs::path(out) / "checkpoint-000001" / "weights.txt").string()), "first\n");
          EXPECT_EQ(latest, "checkpoint-000001\n");
          EXPECT_EQ(entries_in(out), 2u) << "only checkpoint-000001 and latest";
        }
      }
    }
  }
}

}  // namespace
}  // namespace trillion
