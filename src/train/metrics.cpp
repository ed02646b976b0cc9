// metrics.jsonl writing and the progress line (see metrics.h).
#include "train/metrics.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_output.h"

namespace trillion {
namespace {

// The lines of an existing metrics file whose step is ≤ resume_step; unparsable lines (a line cut
// by an interruption) are dropped.
std::string kept_lines(const std::string& path, int64_t resume_step) {
  std::istringstream in(read_file(path));
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) continue;
    if (record["step"].get<int64_t>() <= resume_step) kept += line + "\n";
  }
  return kept;
}

std::string format_duration(double seconds) {
  const int64_t total = seconds < 0 ? 0 : static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(text, sizeof(text), "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return text;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& out_dir, int64_t resume_step)
    : path_((std::filesystem::path(out_dir) / "metrics.jsonl").string()) {
  const bool keep = resume_step > 0 && std::filesystem::exists(path_);
  write_file_atomic(path_, keep ? kept_lines(path_, resume_step) : std::string());
  if (const int error = file_output().open_for_appending(path_, &descriptor_))
    fail(path_, ": cannot open for appending: ", std::strerror(error));
}

MetricsLog::~MetricsLog() {
  if (descriptor_ >= 0) file_output().close_file(descriptor_);  // errors ignored: every line was written
}

void MetricsLog::append(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (const int error = write_all(file_output(), descriptor_, line.data(), line.size()))
    fail(path_, ": cannot append the metrics of step ", record.value("step", int64_t(-1)), ": ", std::strerror(error));
}

void MetricsLog::sync() {
  if (const int error = file_output().sync_file(descriptor_)) fail(path_, ": cannot fsync: ", std::strerror(error));
}

std::string format_progress(const ProgressLine& p) {
  // Each field is formatted into its own small string (a number printed with %f can be hundreds of
  // characters long), then joined, so no segment can overflow a shared fixed-size buffer.
  const auto formatted = [](const char* format, auto... values) {
    const int size = std::snprintf(nullptr, 0, format, values...);
    if (size <= 0) return std::string();  // an encoding error (or nothing to print)
    std::string text(static_cast<size_t>(size) + 1, '\0');
    std::snprintf(text.data(), text.size(), format, values...);
    text.resize(static_cast<size_t>(size));
    return text;
  };
  std::string line = formatted("step %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | ", static_cast<long long>(p.step),
                               static_cast<long long>(p.steps), p.loss, p.lr, p.grad_norm);
  if (p.tokens_per_s >= 1e3) {
    line += formatted("%.1fk tok/s", p.tokens_per_s / 1e3);
  } else {
    line += formatted("%.0f tok/s", p.tokens_per_s);
  }
  if (p.mfu >= 0) line += formatted(" | MFU %.1f%%%s", 100.0 * p.mfu, p.mfu_ceiling_stale ? " (ceiling stale)" : "");
  if (p.mfu >= 0 && p.mfu_peak >= 0) line += formatted(" (peak %.1f%%)", 100.0 * p.mfu_peak);
  if (p.val_loss >= 0) line += formatted(" | val %.4f", p.val_loss);
  line += " | ETA " + format_duration(p.eta_s);
  return line;
}

}  // namespace trillion
