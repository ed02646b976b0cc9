// CrashPointFileOutput (io/crash_points.h) in a forked child that it stops: a process crash keeps
// every byte written; a power loss drops the bytes after a file's last fsync and undoes directory
// changes its directory's fsync did not make durable (a new file vanishes, a rename over an old
// file brings the old one back), while what was synced survives. So a missing fsync shows.
#include "io/crash_points.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <tuple>

#include "io/atomic_file.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;
using test::ScratchDir;

// Runs `work` with a crash point after its k-th file operation, in a child that must be stopped there.
void crash_during(int64_t k, bool drop_unsynced, const std::function<void()>& work) {
  GTEST_FLAG_SET(death_test_style, "fast");  // a fork: the child sees the parent's scratch directory
  EXPECT_EXIT(
      {
        CrashPointFileOutput output(k, drop_unsynced);
        ScopedFileOutput scope(output);
        work();
        std::_Exit(0);  // not reached when the k-th operation happens
      },
      ::testing::ExitedWithCode(kCrashExitCode), "crash point: stopped after file operation");
}

// Creates `path` with `text` but never fsyncs it: open, write, close.
void write_unsynced(const std::string& path, const std::string& text) {
  FileOutput& output = file_output();
  int descriptor = -1;
  ASSERT_EQ(output.open_for_writing(path, &descriptor), 0);
  ASSERT_EQ(write_all(output, descriptor, text.data(), text.size()), 0);
  ASSERT_EQ(output.close_file(descriptor), 0);
}

TEST(CrashPoints, AProcessCrashKeepsEveryByteWritten) {
  ScratchDir dir;
  const std::string path = dir.path() + "/unsynced.txt";
  crash_during(3, false, [&] { write_unsynced(path, "kept\n"); });
  EXPECT_EQ(read_file(path), "kept\n");
}

TEST(CrashPoints, APowerLossDropsUnsyncedFilesAndBytes) {
  ScratchDir dir;
  const std::string never_synced = dir.path() + "/new.txt", data_unsynced = dir.path() + "/entry_synced.txt";
  crash_during(3, true, [&] { write_unsynced(never_synced, "lost\n"); });
  EXPECT_FALSE(fs::exists(never_synced)) << "its directory entry was never synced";
  // The entry made durable by a directory sync, the bytes not by an fsync: an empty file remains.
  crash_during(4, true, [&] {
    write_unsynced(data_unsynced, "lost\n");
    sync_directory(dir.path());
  });
  ASSERT_TRUE(fs::exists(data_unsynced));
  EXPECT_EQ(fs::file_size(data_unsynced), 0u);
}

// write_file_atomic: open, write, fsync, close, rename over the old file, directory sync.
TEST(CrashPoints, APowerLossBeforeTheDirectorySyncBringsTheReplacedFileBack) {
  ScratchDir dir;
  const std::string latest = dir.path() + "/latest";
  for (const auto& [k, drop, expected] : {std::tuple{5, true, "old\n"}, {6, true, "new\n"}, {5, false, "new\n"}}) {
    SCOPED_TRACE(str_cat("crash after operation ", k, drop ? ", power loss" : ", process crash"));
    write_file_atomic(latest, "old\n");
    crash_during(k, drop, [&] { write_file_atomic(latest, "new\n"); });
    EXPECT_EQ(read_file(latest), expected);
    size_t entries = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++entries;
    EXPECT_EQ(entries, 1u) << "no temporary or backup file is left";
  }
}

// A directory renamed into place (as a checkpoint is) vanishes with its files unless the parent's
// fsync made the rename durable; synced, it stays whole.
TEST(CrashPoints, APowerLossUndoesAnUnsyncedDirectoryRename) {
  ScratchDir dir;
  const std::string temp = dir.path() + "/.checkpoint.tmp", final_dir = dir.path() + "/checkpoint";
  const auto write_checkpoint_like = [&] {
    ASSERT_EQ(file_output().make_directory(temp), 0);
    write_file_atomic(temp + "/weights", "weights\n");  // 6 operations
    sync_directory(temp);
    ASSERT_EQ(file_output().rename_file(temp, final_dir), 0);  // operation 9
    sync_directory(dir.path());
  };
  crash_during(9, true, write_checkpoint_like);
  EXPECT_FALSE(fs::exists(final_dir));
  EXPECT_FALSE(fs::exists(temp)) << "its creation was not durable either";
  crash_during(10, true, write_checkpoint_like);
  EXPECT_EQ(read_file(final_dir + "/weights"), "weights\n");
}

}  // namespace
}  // namespace trillion
