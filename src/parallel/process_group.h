// ProcessGroup: the ranks a collective runs over (docs/architecture.md, "The parallel layout").
//
// A process started by mpirun (OpenMPI, or any launcher that sets PMI/PMIx variables) joins MPI's
// world on first use of ProcessGroup::world(); a process started without one is a group of one
// rank whose collectives return at once without MPI, so a single rank runs the same code path and
// the tests and tools that never touch MPI need no launcher. Collectives are sums, gathers and
// reduce-scatters that return when done; counts above what one MPI call takes are sent in pieces,
// in a fixed order, so results depend only on the inputs and the number of ranks.
//
// Errors: a rank that fails calls abort_all, which prints the rank and the cause and ends every
// rank (MPI_Abort) instead of leaving the others waiting in a collective. A rank that stops
// responding (hung, or stopped by a signal) is caught by a timeout: each collective is issued
// non-blocking and waited for at most the collective timeout (default 600 s); then the waiting rank
// pings every other rank (ranks waiting in a collective answer), names those that stay silent for a
// grace period (10 s, or the timeout if shorter) and ends the job. (A rank that dies is reported,
// and the job ended, by mpirun itself.)
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trillion {

class ProcessGroup {
 public:
  // MPI's world when launched by mpirun, else a group of one (initialized once, on first use).
  static ProcessGroup& world();

  // The ranks of this group with the same `color`, ordered by `key` (MPI_Comm_split; every rank of
  // this group calls it). A group of one splits into itself.
  ProcessGroup split(int color, int key) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  // "rank 1 of 4" (for messages).
  std::string describe() const;

  // In place: values[i] = Σ over the ranks of their values[i].
  void all_reduce_sum(double* values, int64_t count) const;
  double all_reduce_sum(double value) const;
  // Every rank's `values` (the same count on every rank), rank after rank: [size · values.size()].
  template <class T>
  std::vector<T> all_gather_values(const std::vector<T>& values) const;

  // A collective started and not yet complete (the start_* calls; completed by finish()).
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    const char* call = "";
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;  // alive until complete
  };

  // Rank r's counts[r] elements of the sum over the ranks of send[Σ counts] (the pieces in rank
  // order) land in recv[counts[rank]]; recv may not overlap send.
  template <class T>
  void reduce_scatter_sum(const T* send, T* recv, const std::vector<int64_t>& counts) const;
  // recv[Σ counts] ← every rank's send[counts[its rank]] at displs[its rank]; send may be
  // recv + displs[rank] (in place).
  template <class T>
  void all_gather(const T* send, T* recv, const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) const;
  // The same, started (completed by finish(); send and recv untouched until then).
  template <class T>
  Pending start_all_gather(const T* send, T* recv, const std::vector<int64_t>& counts,
                                  const std::vector<int64_t>& displs) const;

  // How long a collective may wait before the job is ended (seconds, > 0).
  void set_collective_timeout(double seconds);

  // Started: send[Σ send_counts] in pieces of send_counts[r] elements to rank r; recv[Σ
  // recv_counts] gets recv_counts[r] elements from each rank r, in rank order. It runs while the
  // caller computes (as far as the MPI library progresses it) and is completed by finish(); send
  // and recv must stay untouched until then.
  template <class T>
  Pending start_all_to_all(const T* send, const std::vector<int64_t>& send_counts, T* recv,
                           const std::vector<int64_t>& recv_counts) const;
  void finish(Pending& pending) const;
  // text ← rank 0's text on every rank.
  void broadcast(std::string& text) const;
  // Returns when every rank has called it.
  void barrier() const;
  // recv[size · n] gets n values from each rank, in rank order; send[size · n]: n for each rank.
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) const;

  // Under MPI: prints "error: rank R of N: message" (R, N of the world) and ends every rank with
  // `code` (MPI_Abort).
  [[noreturn]] void abort_all(const std::string& message, int code) const;
  bool uses_mpi() const { return uses_mpi_; }

 private:
  ProcessGroup() = default;
  void wait(MPI_Request& request, const char* call) const;
  MPI_Comm comm() const { return comm_; }
  bool uses_mpi_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;  // null: a group of one without MPI
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 600.0;
};

// MPI_Finalize when the world joined MPI (call once, at a normal exit of main).
void finalize_processes();

}  // namespace trillion
