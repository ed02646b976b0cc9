// Available memory from /proc/meminfo and the cgroup limits; the refusal of jobs that cannot fit.
#include "core/machine_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace trillion {
namespace {

// The value after "key" (then ':' or ' ') on the first line of `path` that starts with it, times
// `unit`; -1 when the file or the key is missing.
int64_t keyed_value(const char* path, const std::string& key, int64_t unit) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0 || line.size() <= key.size() || (line[key.size()] != ':' && line[key.size()] != ' '))
      continue;
    std::istringstream rest(line.substr(key.size() + 1));
    int64_t value = 0;
    if (rest >> value) return value * unit;
  }
  return -1;
}

// The first number in `path`; -1 when the file is missing or holds none ("max": no limit).
int64_t file_number(const char* path) {
  std::ifstream in(path);
  int64_t value = 0;
  return in >> value ? value : -1;
}

// Room under one cgroup's limit: limit − (usage − inactive file pages); -1 without a limit.
int64_t cgroup_room(const char* limit_path, const char* usage_path, const char* stat_path, const char* inactive_key) {
  const int64_t limit = file_number(limit_path);
  if (limit < 0 || limit >= (int64_t(1) << 60)) return -1;  // v1 reports "no limit" as about 2^63
  const int64_t usage = file_number(usage_path);
  const int64_t inactive = std::max<int64_t>(keyed_value(stat_path, inactive_key, 1), 0);
  return std::max<int64_t>(limit - std::max<int64_t>(usage - inactive, 0), 0);
}

}  // namespace

AvailableMemory available_memory() {
  AvailableMemory available{keyed_value("/proc/meminfo", "MemAvailable", 1024), "MemAvailable of /proc/meminfo"};
  if (available.bytes < 0) available = {std::numeric_limits<int64_t>::max(), "no /proc/meminfo: not bounded"};
  const struct {
    const char *limit, *usage, *stat, *inactive;
  } cgroups[] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
                  "inactive_file"},
                 {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                  "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"}};
  for (const auto& cgroup : cgroups) {
    const int64_t room = cgroup_room(cgroup.limit, cgroup.usage, cgroup.stat, cgroup.inactive);
    if (room >= 0 && room < available.bytes) available = {room, std::string("cgroup limit of ") + cgroup.limit};
  }
  return available;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) bytes /= 1024.0, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

void require_memory(int64_t needed, const std::string& what, const std::string& detail, const std::string& remedy) {
  const AvailableMemory available = available_memory();
  if (needed <= available.bytes) return;
  fail(what, " needs ", needed, " bytes (", human_bytes(double(needed)), ") of memory", detail, "; this machine has ",
       available.bytes, " bytes (", human_bytes(double(available.bytes)), ") available (", available.source, ")",
       remedy.empty() ? "" : "; expected ", remedy);
}

}  // namespace trillion
