// Turns: bounded spin, then futex sleep. See turns.h.
#include "core/turns.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace trillion {
namespace {

// A few µs of pause instructions: long enough for a turn passed by a running thread, short
// against a time slice lost to another process.
constexpr int kSpinPauses = 256;

static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t) && std::atomic<int32_t>::is_always_lock_free,
              "the futex word is the atomic itself");

int* futex_word(std::atomic<int32_t>& word) { return reinterpret_cast<int*>(&word); }

}  // namespace

void Turn::wait_for(int64_t turn_number) {
  const int32_t turn = static_cast<int32_t>(turn_number);
  for (int spin = 0; spin < kSpinPauses; ++spin) {
    if (turn_.load(std::memory_order_acquire) == turn) return;
    _mm_pause();
  }
  // Sequentially consistent with pass_to: either the passer sees this sleeper, or this waiter sees
  // the passed turn; FUTEX_WAIT rechecks the word in the kernel, so no wake-up is lost.
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  for (int32_t now = turn_.load(std::memory_order_seq_cst); now != turn; now = turn_.load(std::memory_order_seq_cst))
    syscall(SYS_futex, futex_word(turn_), FUTEX_WAIT_PRIVATE, now, nullptr, nullptr, 0);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void Turn::pass_to(int64_t next) {
  turn_.store(static_cast<int32_t>(next), std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, futex_word(turn_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace trillion
