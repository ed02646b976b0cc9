// The progress line: its fields, and no truncation or overflow when a number prints very long.
// metrics.jsonl through the file-output interface: a resumed log keeps the lines up to its step,
// and a failed append or fsync is an error naming the file (fault injection).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "io/atomic_file.h"
#include "io/file_output.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"
#include "train/metrics.h"

namespace trillion {
namespace {

TEST(ProgressLine, FormatsEveryField) {
  ProgressLine p;
  p.step = 12;
  p.steps = 40;
  p.loss = 5.1234;
  p.lr = 2.4e-3;
  p.grad_norm = 1.234;
  p.tokens_per_s = 12345.0;
  p.mfu = 0.041;
  p.eta_s = 42;
  EXPECT_EQ(format_progress(p), "step 12/40 | loss 5.1234 | lr 2.40e-03 | gnorm 1.234 | 12.3k tok/s | MFU 4.1% | ETA 0:42");
  p.mfu_peak = 0.021;  // against the physical peak, beside it
  EXPECT_EQ(format_progress(p),
            "step 12/40 | loss 5.1234 | lr 2.40e-03 | gnorm 1.234 | 12.3k tok/s | MFU 4.1% (peak 2.1%) | ETA 0:42");
  p.mfu_peak = -1;
  p.mfu = 1.2;  // above 1 only with a stale ceiling, and then it says so
  p.mfu_ceiling_stale = true;
  EXPECT_NE(format_progress(p).find(" | MFU 120.0% (ceiling stale) | "), std::string::npos) << format_progress(p);
  p.mfu_ceiling_stale = false;
  p.mfu = -1;
  p.val_loss = 4.5;
  p.tokens_per_s = 250;
  EXPECT_EQ(format_progress(p), "step 12/40 | loss 5.1234 | lr 2.40e-03 | gnorm 1.234 | 250 tok/s | val 4.5000 | ETA 0:42");
}

TEST(ProgressLine, HugeNumbersAreNotCut) {
  ProgressLine p;
  p.step = 1;
  p.steps = 2;
  p.loss = 1e300;  // %.4f prints 301 digits
  p.grad_norm = 1e300;
  p.tokens_per_s = 1e300;
  p.mfu = 0.5;
  p.val_loss = 1e300;
  p.eta_s = 3600;
  const std::string line = format_progress(p);
  EXPECT_GT(line.size(), 1200u);
  EXPECT_NE(line.find(" | MFU 50.0% | val 1"), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with(" | ETA 1:00:00")) << line;
}

TEST(MetricsLog, KeepsLinesUpToTheResumedStepAndNamesTheFileOnFailure) {
  test::ScratchDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  {
    MetricsLog log(dir.path(), 0);
    for (int step = 1; step <= 3; ++step) log.append({{"step", step}, {"loss", 1.0 / step}});
    log.sync();
  }
  {
    MetricsLog resumed(dir.path(), 2);
    resumed.append({{"step", 3}, {"loss", 0.25}});
  }
  EXPECT_EQ(read_file(path), "{\"loss\":1.0,\"step\":1}\n{\"loss\":0.5,\"step\":2}\n{\"loss\":0.25,\"step\":3}\n");

  for (const FileOperation operation : {FileOperation::write, FileOperation::fsync}) {
    MetricsLog log(dir.path(), 3);  // its atomic rewrite, before the faults
    FaultInjectingFileOutput output;
    output.fail_nth(operation, 1, operation == FileOperation::write ? ENOSPC : EIO);
    ScopedFileOutput scope(output);
    const std::string message = testing::error_message([&] {
      log.append({{"step", 4}, {"loss", 0.2}});
      log.sync();
    });
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(operation == FileOperation::write ? ENOSPC : EIO)), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace trillion
