// Crash points (see crash_points.h): counting, the bookkeeping of what is not yet durable, and the
// power-loss undo at the crash.
#include "io/crash_points.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace trillion {
namespace fs = std::filesystem;
namespace {

// A path in one spelling: lexically normal, without a trailing separator ("." for the empty one).
std::string normal(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.empty() && p.filename().empty()) p = p.parent_path();
  return p.empty() ? std::string(".") : p.string();
}

std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(normal(path)).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Whether `path` is `root` or lies below it.
bool at_or_below(const std::string& path, const std::string& root) {
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/');
}

}  // namespace

CrashPointFileOutput::CrashPointFileOutput(int64_t crash_after, bool drop_unsynced, FileOutput& target)
    : target_(target), crash_after_(crash_after), drop_unsynced_(drop_unsynced) {}

void CrashPointFileOutput::finished(FileOperation operation, const std::string& path) {
  if (++operations_ == crash_after_) crash(operation, path);
}

void CrashPointFileOutput::move_tracked(const std::string& from, const std::string& to) {
  std::map<std::string, int64_t> moved;
  for (auto it = synced_.begin(); it != synced_.end();) {
    if (!at_or_below(it->first, from)) {
      ++it;
      continue;
    }
    moved[to + it->first.substr(from.size())] = it->second;
    it = synced_.erase(it);
  }
  for (auto& [path, bytes] : moved) synced_[path] = bytes;
  for (auto& [descriptor, path] : open_paths_)
    if (at_or_below(path, from)) path = to + path.substr(from.size());
}

int CrashPointFileOutput::open_for_writing(const std::string& path, int* descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  struct stat info;
  const bool existed = ::lstat(path.c_str(), &info) == 0;
  const int error = target_.open_for_writing(path, descriptor);
  if (error == 0 && drop_unsynced_) {
    open_paths_[*descriptor] = normal(path);
    synced_[normal(path)] = 0;  // created or truncated: none of its bytes are durable yet
    if (!existed) pending_.push_back({PendingChange::create_file, directory_of(path), normal(path), "", ""});
  }
  finished(FileOperation::open, path);
  return error;
}

int CrashPointFileOutput::open_for_appending(const std::string& path, int* descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.open_for_appending(path, descriptor);
  struct stat info;
  if (error == 0 && drop_unsynced_) {
    open_paths_[*descriptor] = normal(path);
    // A file this process did not write is durable as it is (an earlier process synced it or not:
    // that is beyond this one's crash).
    if (synced_.count(normal(path)) == 0 && ::fstat(*descriptor, &info) == 0) synced_[normal(path)] = info.st_size;
  }
  finished(FileOperation::open, path);
  return error;
}

int CrashPointFileOutput::write_some(int descriptor, const char* data, size_t size, size_t* written) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.write_some(descriptor, data, size, written);
  finished(FileOperation::write, open_paths_.count(descriptor) != 0 ? open_paths_[descriptor] : "");
  return error;
}

int CrashPointFileOutput::sync_file(int descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.sync_file(descriptor);
  const auto open = open_paths_.find(descriptor);
  struct stat info;
  if (error == 0 && open != open_paths_.end() && ::fstat(descriptor, &info) == 0) synced_[open->second] = info.st_size;
  finished(FileOperation::fsync, open != open_paths_.end() ? open->second : "");
  return error;
}

int CrashPointFileOutput::close_file(int descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string path = open_paths_.count(descriptor) != 0 ? open_paths_[descriptor] : "";
  const int error = target_.close_file(descriptor);
  open_paths_.erase(descriptor);
  finished(FileOperation::close, path);
  return error;
}

int CrashPointFileOutput::rename_file(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string backup;
  struct stat info;
  if (drop_unsynced_ && ::lstat(to.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
    backup = normal(to) + ".crash-backup." + std::to_string(++backups_);
    if (::link(to.c_str(), backup.c_str()) != 0) backup.clear();
  }
  const int error = target_.rename_file(from, to);
  if (drop_unsynced_ && error == 0) {
    if (!backup.empty()) {
      const auto replaced = synced_.find(normal(to));
      if (replaced != synced_.end()) synced_[backup] = replaced->second;  // the replaced file's durable bytes
    }
    move_tracked(normal(from), normal(to));
    pending_.push_back({PendingChange::rename, directory_of(to), normal(from), normal(to), backup});
  } else if (!backup.empty()) {
    ::unlink(backup.c_str());
  }
  finished(FileOperation::rename, to);
  return error;
}

int CrashPointFileOutput::sync_directory(const std::string& directory) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.sync_directory(directory);
  if (error == 0 && drop_unsynced_) {
    const std::string key = normal(directory);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->directory != key) {
        ++it;
        continue;
      }
      if (!it->backup.empty()) {  // the rename is durable: the replaced file is gone for good
        ::unlink(it->backup.c_str());
        synced_.erase(it->backup);
      }
      it = pending_.erase(it);
    }
  }
  finished(FileOperation::sync_directory, directory);
  return error;
}

int CrashPointFileOutput::remove_file(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.remove_file(path);
  if (error == 0) synced_.erase(normal(path));
  finished(FileOperation::remove, path);
  return error;
}

int CrashPointFileOutput::make_directory(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.make_directory(path);
  if (error == 0 && drop_unsynced_)
    pending_.push_back({PendingChange::create_directory, directory_of(path), normal(path), "", ""});
  finished(FileOperation::make_directory, path);
  return error;
}

int CrashPointFileOutput::exchange(const std::string& a, const std::string& b) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int error = target_.exchange(a, b);
  if (error == 0 && drop_unsynced_) {
    const std::string swap_marker = normal(a) + ".crash-exchange";
    move_tracked(normal(a), swap_marker);
    move_tracked(normal(b), normal(a));
    move_tracked(swap_marker, normal(b));
    pending_.push_back({PendingChange::exchange, directory_of(b), normal(a), normal(b), ""});
  }
  finished(FileOperation::exchange, b);
  return error;
}

void CrashPointFileOutput::crash(FileOperation operation, const std::string& path) {
  if (drop_unsynced_) {
    for (const auto& [file, bytes] : synced_) {  // bytes past the last fsync
      if (::truncate(file.c_str(), bytes) != 0) continue;  // gone already: nothing to cut
    }
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {  // newest first
      switch (it->kind) {
        case PendingChange::create_file: ::unlink(it->a.c_str()); break;
        case PendingChange::create_directory: {
          std::error_code ignored;
          fs::remove_all(it->a, ignored);
          break;
        }
        case PendingChange::rename:
          ::rename(it->b.c_str(), it->a.c_str());
          if (!it->backup.empty()) ::rename(it->backup.c_str(), it->b.c_str());
          break;
        case PendingChange::exchange:
          ::renameat2(AT_FDCWD, it->b.c_str(), AT_FDCWD, it->a.c_str(), RENAME_EXCHANGE);
          break;
      }
    }
  }
  std::fprintf(stderr, "crash point: stopped after file operation %lld (%s %s)%s\n",
               static_cast<long long>(operations_), file_operation_name(operation), path.c_str(),
               drop_unsynced_ ? ", unsynced data and directory changes dropped" : "");
  std::fflush(stderr);
  std::_Exit(kCrashExitCode);
}

void install_crash_points_from_environment() {
  const char* after = std::getenv("TRILLION_CRASH_AFTER_FILE_OPS");
  if (after == nullptr) return;
  char* end = nullptr;
  const long long k = std::strtoll(after, &end, 10);
  if (*after == '\0' || *end != '\0' || k < 1)
    fail("TRILLION_CRASH_AFTER_FILE_OPS: got \"", after, "\"; expected a positive integer");
  const char* drop = std::getenv("TRILLION_CRASH_DROP_UNSYNCED");
  static CrashPointFileOutput output(k, drop != nullptr && std::string(drop) == "1");
  static ScopedFileOutput installed(output);
}

}  // namespace trillion
