// SwapEngine: tensors written to the swap file and read back bit for bit (O_DIRECT where the file
// system allows it, and buffered), jobs in order, and a write that cannot complete (the file-size
// limit standing in for a full disk) is an error naming the file, never a silent wrong result.
#include "memory/swap_engine.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/half_float.h"
#include "memory/page_arena.h"

namespace trillion {
namespace {

void round_trip(SwapEngine::Io io) {
  SwapEngine engine(::testing::TempDir(), io);
  PageArena arena;
  const int64_t bytes = 5 * PageArena::page_bytes() + 123;
  auto* out = static_cast<unsigned char*>(arena.alloc(bytes));
  auto* second = static_cast<unsigned char*>(arena.alloc(bytes));
  for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 7 + 3), second[i] = 0xA5;
  const SwapEngine::Ticket w1 = engine.write_out(out, bytes, 0);
  const SwapEngine::Ticket w2 = engine.write_out(second, bytes, PageArena::rounded(bytes));
  engine.wait(w2);
  EXPECT_TRUE(engine.done(w1));  // in order
  std::memset(out, 0, bytes);
  std::memset(second, 0, bytes);
  engine.wait(engine.read_in(second, bytes, 0));  // the first tensor into the second span
  for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(second[i], static_cast<unsigned char>(i * 7 + 3)) << i;
  engine.wait(engine.read_in(out, bytes, PageArena::rounded(bytes)));
  for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(out[i], 0xA5) << i;
  EXPECT_EQ(engine.bytes_written(), 2 * bytes);
  EXPECT_EQ(engine.bytes_read(), 2 * bytes);
}

TEST(SwapEngine, RoundTripDirect) { round_trip(SwapEngine::Io::automatic); }
TEST(SwapEngine, RoundTripBuffered) { round_trip(SwapEngine::Io::buffered); }

// bf16 (asked for, lossy): floats come back rounded to bfloat16 exactly as the checkpoint encoder
// rounds them, across staging chunks; the file holds half the bytes.
TEST(SwapEngine, Bf16RoundTripRoundsToNearestEven) {
  SwapEngine engine(::testing::TempDir());
  PageArena arena;
  const int64_t floats = SwapEngine::kStagingBytes / 2 + 1000;  // one full chunk and a partial one
  const int64_t bytes = floats * 4;
  auto* values = static_cast<float*>(arena.alloc(bytes));
  for (int64_t i = 0; i < floats; ++i) values[i] = std::sin(0.001f * float(i)) * 3.0f + 1e-3f * float(i % 7);
  std::vector<float> expected(floats);
  for (int64_t i = 0; i < floats; ++i) expected[i] = static_cast<float>(bf16_to_double(bf16_from_double(values[i])));
  EXPECT_EQ(SwapEngine::file_bytes(bytes, true), SwapEngine::kStagingBytes + PageArena::rounded(1000 * 2));
  engine.wait(engine.write_out(values, bytes, 0, /*bf16=*/true));
  std::memset(values, 0, bytes);
  engine.wait(engine.read_in(values, bytes, 0, /*bf16=*/true));
  for (int64_t i = 0; i < floats; ++i) ASSERT_EQ(values[i], expected[i]) << i;
}

TEST(SwapEngine, AWriteThatFailsIsAnErrorNamingTheFile) {
  SwapEngine engine(::testing::TempDir(), SwapEngine::Io::buffered);
  PageArena arena;
  const int64_t bytes = int64_t{4} << 20;
  void* span = arena.alloc(bytes);
  std::memset(span, 1, bytes);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  void (*saved_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  rlimit limited = saved;
  limited.rlim_cur = 1 << 20;  // 1 MiB: the 4 MiB write cannot complete
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const SwapEngine::Ticket ticket = engine.write_out(span, bytes, 0);
  std::string message;
  try {
    engine.wait(ticket);
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_NE(message.find("swap file in " + ::testing::TempDir()), std::string::npos) << message;
  EXPECT_NE(message.find("write of 4194304 bytes at offset 0 failed"), std::string::npos) << message;
  // Later jobs fail too until drain(): nothing after a failure is trusted.
  EXPECT_THROW(engine.wait(engine.read_in(span, bytes, 0)), Error);
  engine.drain();
  EXPECT_EQ(engine.bytes_written(), 0);
}

}  // namespace
}  // namespace trillion
