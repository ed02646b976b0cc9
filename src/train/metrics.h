// Training metrics: OUT/metrics.jsonl (one JSON object per optimizer step, appended as the run
// goes) and the human progress line on stderr.
//
// A resumed run first rewrites the file (atomically) without the lines of steps after the resumed
// step, so a run interrupted after its last checkpoint and resumed still yields one valid JSONL
// line per step. The lines are written through the file-output interface (io/file_output.h) and
// fsynced before each checkpoint (sync()): a checkpoint that survives a power loss has every line
// up to its step.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trillion {

class MetricsLog {
 public:
  // Opens OUT/metrics.jsonl: truncated when resume_step is 0, otherwise keeping the lines with
  // "step" ≤ resume_step.
  MetricsLog(const std::string& out_dir, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void append(const nlohmann::json& record);  // one line, handed to the kernel
  void sync();  // fsync: every line appended so far is durable
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int descriptor_ = -1;
};

struct ProgressLine {
  int64_t step = 0;
  int64_t steps = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double mfu = -1.0;   // model FLOPs utilization in [0, 1]; < 0 when unknown
  bool mfu_ceiling_stale = false;  // mfu > 1 even against a re-measured ceiling: printed as such
  double mfu_peak = -1.0;  // the same FLOPs against the physical peak (bench/physical_peak.h); < 0: unknown
  double eta_s = 0.0;  // seconds to the end of this process's run
  double val_loss = -1.0;  // < 0 when not evaluated this step
};

// "step 12/40 | loss 5.1234 | lr 2.40e-03 | gnorm 1.234 | 12.3k tok/s | MFU 4.1% (peak 2.0%) | ETA 0:42"
std::string format_progress(const ProgressLine& line);

}  // namespace trillion
