// Crash points: a test mode that ends the process right after its k-th file operation, to prove
// that every moment of a checkpoint write leaves a resumable run (LevelDB's fault-injection Env,
// in spirit). CrashPointFileOutput forwards every operation of the file-output interface
// (io/file_output.h) to the real file system and counts them; after the k-th it stops the process
// at once with _exit(kCrashExitCode): no destructor, no cleanup, as a crash would.
//
// Two modes:
//   - crash: everything done so far stays, as when only the process dies (the kernel still holds
//     every written byte);
//   - drop unsynced: a power loss. Before exiting, every file's bytes written since its last fsync
//     are cut off (a file never synced becomes empty), and every directory change not yet made
//     durable by an fsync of its directory is undone, newest first: a created file or directory is
//     removed, a rename goes back (a file it replaced returns, kept meanwhile through a hard link),
//     an exchange is swapped back. So a missing fsync of a file or of a directory shows up as a
//     lost or empty file after the "crash". Removals count as durable at once (the mode errs
//     toward keeping old files, which a resume must tolerate anyway).
//
// Every trillion command installs it from the environment (install_crash_points_from_environment):
//   TRILLION_CRASH_AFTER_FILE_OPS=k   crash right after the k-th file operation (1-based)
//   TRILLION_CRASH_DROP_UNSYNCED=1    in the drop-unsynced mode
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "io/file_output.h"

namespace trillion {

// The exit status of a process stopped at a crash point.
constexpr int kCrashExitCode = 86;

class CrashPointFileOutput : public FileOutput {
 public:
  CrashPointFileOutput(int64_t crash_after, bool drop_unsynced, FileOutput& target = posix_file_output());

  int open_for_writing(const std::string& path, int* descriptor) override;
  int open_for_appending(const std::string& path, int* descriptor) override;
  int write_some(int descriptor, const char* data, size_t size, size_t* written) override;
  int sync_file(int descriptor) override;
  int close_file(int descriptor) override;
  int rename_file(const std::string& from, const std::string& to) override;
  int sync_directory(const std::string& directory) override;
  int remove_file(const std::string& path) override;
  int make_directory(const std::string& path) override;
  int exchange(const std::string& a, const std::string& b) override;

 private:
  // A directory change not yet durable: the directory whose fsync makes it so, and how to undo it.
  struct PendingChange {
    enum Kind { create_file, create_directory, rename, exchange } kind;
    std::string directory;
    std::string a, b;    // the path (creations); from and to (rename); the two paths (exchange)
    std::string backup;  // rename over an existing file: a hard link to the file it replaced
  };

  // Counts one finished operation; stops the process when it is the k-th.
  void finished(FileOperation operation, const std::string& path);
  // Renames the tracked files at or below `from` to the same place below `to`.
  void move_tracked(const std::string& from, const std::string& to);
  // What a power loss would lose, then _exit(kCrashExitCode).
  [[noreturn]] void crash(FileOperation operation, const std::string& path);

  FileOutput& target_;
  const int64_t crash_after_;
  const bool drop_unsynced_;
  std::mutex mutex_;
  int64_t operations_ = 0;
  std::map<int, std::string> open_paths_;     // descriptor → path
  std::map<std::string, int64_t> synced_;     // path → bytes made durable by its last fsync
  std::vector<PendingChange> pending_;        // oldest first
  int64_t backups_ = 0;
};

// Installs a CrashPointFileOutput as the process-wide FileOutput when TRILLION_CRASH_AFTER_FILE_OPS
// is set (a positive integer; anything else fails with the variable named).
void install_crash_points_from_environment();

}  // namespace trillion
