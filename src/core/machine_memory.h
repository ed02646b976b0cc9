// The memory this machine can give the process, and the up-front refusal of a job that cannot fit
// it: a config whose parameters, gradients, optimizer state or activations exceed what is
// available gets a one-line error with the bytes needed and available before anything large is
// allocated (instead of an allocation failure, or the kernel's OOM killer, minutes later).
//
// Available = MemAvailable of /proc/meminfo, lowered to the room left under the process's cgroup
// memory limit where one is set (cgroup v2 memory.max, or v1 memory.limit_in_bytes; the room is the
// limit minus usage, reclaimable file pages not counted as used).
#pragma once

#include <cstdint>
#include <string>

namespace trillion {

struct AvailableMemory {
  int64_t bytes = 0;
  std::string source;  // "MemAvailable of /proc/meminfo", or the cgroup file that set the bound
};

AvailableMemory available_memory();

// "12.5 GiB" style rendering of a byte count (KiB, MiB, GiB, TiB, PiB; one decimal).
std::string human_bytes(double bytes);

// Throws trillion::Error when `needed` bytes exceed the available memory:
//   "<what> needs N bytes (X GiB) of memory<detail>; this machine has M bytes (Y GiB) available
//    (source)[; expected <remedy>]"
// detail: an optional breakdown, such as " (parameters P, gradients G, …)"; remedy: what to change.
void require_memory(int64_t needed, const std::string& what, const std::string& detail = "",
                    const std::string& remedy = "");

}  // namespace trillion
