// Turns: lets the items of a dynamic parallel loop do one step each in item order, so that a
// scatter of their partial results (dk rows of the indexer loss, dq rows of attention) adds in a
// fixed order whatever thread ran which item. An item waits for its turn, does its step and
// passes the turn on.
//
// Why not a plain spin with sched_yield: on a machine where another process holds one of the
// cores, a yielding waiter hands that process the rest of its time slice, and every later item
// waits behind it; a step slowed by an order of magnitude (docs/architecture.md, "Parallel
// regions"). Here a waiter spins a few µs, then sleeps in the kernel (futex) until the turn
// it waits for is passed, and a passer wakes sleepers only when there are some.
#pragma once

#include <atomic>
#include <cstdint>

namespace trillion {

class Turn {
 public:
  // Returns once the turn is `turn` (turns start at 0). The futex word holds a turn's low 32 bits:
  // only equality is compared, and a loop's turns lie far less than 2³² apart.
  void wait_for(int64_t turn);
  // Makes the turn `next` and wakes whoever waits for it.
  void pass_to(int64_t next);

 private:
  std::atomic<int32_t> turn_{0};
  std::atomic<int32_t> sleepers_{0};
};

}  // namespace trillion
