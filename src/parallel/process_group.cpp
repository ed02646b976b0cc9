// The MPI-backed process group and its single-rank form. See process_group.h.
#include "parallel/process_group.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"

namespace trillion {
namespace {

// Set by mpirun (OpenMPI), by PMIx launchers, or by MPICH's Hydra.
bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(call, " failed: ", std::string(text, length));
}

// The largest count one MPI call takes (its counts are int).
constexpr int64_t kMaxPiece = INT_MAX / 2;
// Point-to-point tags of the liveness round of a timed-out collective (nothing else uses tags).
constexpr int kPingTag = 0x7170, kPongTag = 0x7171;
// MPI_Test calls between the waiting loop's checks of the clock and the pings.
constexpr int64_t kPollsPerCheck = 256;

// Answers every ping waiting for this rank on `comm` and on the world (a rank that is waiting in a
// collective is alive).
void answer_pings(MPI_Comm comm) {
  if (comm != MPI_COMM_WORLD) answer_pings(MPI_COMM_WORLD);
  for (;;) {
    int waiting = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, comm, &waiting, &status);
    if (waiting == 0) return;
    int ping = 0;
    MPI_Recv(&ping, 1, MPI_INT, status.MPI_SOURCE, kPingTag, comm, MPI_STATUS_IGNORE);
    MPI_Send(&ping, 1, MPI_INT, status.MPI_SOURCE, kPongTag, comm);
  }
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <>
MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <>
MPI_Datatype mpi_type<bf16>() {  // moved, never reduced: its 16 bits
  static_assert(sizeof(bf16) == sizeof(uint16_t));
  return MPI_UINT16_T;
}

// MPI's int counts of a split (one collective moves at most INT_MAX elements per rank).
std::vector<int> int_counts(const std::vector<int64_t>& counts) {
  std::vector<int> out;
  for (const int64_t c : counts) {
    TRILLION_CHECK(c >= 0 && c <= INT_MAX, "a collective piece of ", c, " elements exceeds MPI's int count");
    out.push_back(static_cast<int>(c));
  }
  return out;
}

}  // namespace

ProcessGroup& ProcessGroup::world() {
  static ProcessGroup group = [] {
    ProcessGroup g;
    if (!launched_by_mpirun()) return g;
    int provided = 0;
    // OpenMP threads compute between collectives; only the main thread calls MPI.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // An error inside MPI returns a code (check_mpi) rather than ending the process silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g.uses_mpi_ = true;
    g.comm_ = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size_);
    return g;
  }();
  return group;
}

ProcessGroup ProcessGroup::split(int color, int key) const {
  if (!uses_mpi_) return *this;
  ProcessGroup g = *this;
  check_mpi(MPI_Comm_split(comm_, color, key, &g.comm_), "MPI_Comm_split");
  MPI_Comm_set_errhandler(g.comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g.comm_, &g.rank_);
  MPI_Comm_size(g.comm_, &g.size_);
  return g;
}

std::string ProcessGroup::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

void ProcessGroup::set_collective_timeout(double seconds) {
  if (!(seconds > 0.0)) fail("--collective-timeout must be > 0 seconds, got ", seconds);
  timeout_s_ = seconds;
}

void ProcessGroup::wait(MPI_Request& request, const char* call) const {
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const auto start = std::chrono::steady_clock::now();
  for (int64_t polls = 1;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
    if (done != 0) return;
    if (polls % kPollsPerCheck != 0) continue;  // MPI_Test drives the transfer: poll it tightly
    answer_pings(comm());
    if (since(start) > timeout_s_) break;
    std::this_thread::yield();  // ranks may share cores (mpirun --oversubscribe)
  }
  // Timed out: ping every other rank; those that answer are waiting in a collective too.
  const double grace = std::min(timeout_s_, 10.0);
  std::vector<int> answered(size_, 0), pings(size_, 0), pongs(size_, 0);
  std::vector<MPI_Request> sends(size_, MPI_REQUEST_NULL), receives(size_, MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Isend(&pings[r], 1, MPI_INT, r, kPingTag, comm(), &sends[r]);
    MPI_Irecv(&pongs[r], 1, MPI_INT, r, kPongTag, comm(), &receives[r]);
  }
  const auto asked = std::chrono::steady_clock::now();
  while (since(asked) < grace) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && answered[r] == 0) MPI_Test(&receives[r], &answered[r], MPI_STATUS_IGNORE);
    answer_pings(comm());
    std::this_thread::yield();
  }
  std::string silent;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && answered[r] == 0) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
  abort_all(str_cat(call, " did not complete within --collective-timeout ", timeout_s_, " s; ",
                    silent.empty() ? std::string("every rank answered a ping, so the ranks' collectives differ")
                                   : str_cat("rank ", silent, " did not answer a ping within ", grace,
                                             " s (stopped, hung, or busy outside collectives)")),
            1);
}

void ProcessGroup::all_reduce_sum(double* values, int64_t count) const {
  if (size_ == 1) return;
  for (int64_t at = 0; at < count; at += kMaxPiece) {
    const int piece = static_cast<int>(std::min(kMaxPiece, count - at));
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values + at, piece, MPI_DOUBLE, MPI_SUM, comm(), &request),
              "MPI_Iallreduce");
    wait(request, "MPI_Allreduce");
  }
}

double ProcessGroup::all_reduce_sum(double value) const {
  all_reduce_sum(&value, 1);
  return value;
}

template <class T>
void ProcessGroup::reduce_scatter_sum(const T* send, T* recv, const std::vector<int64_t>& counts) const {
  TRILLION_CHECK(static_cast<int>(counts.size()) == size_, counts.size(), " counts for ", size_, " ranks");
  if (size_ == 1) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  const std::vector<int> ints = int_counts(counts);
  MPI_Request request;
  check_mpi(MPI_Ireduce_scatter(send, recv, ints.data(), mpi_type<T>(), MPI_SUM, comm(), &request),
            "MPI_Ireduce_scatter");
  wait(request, "MPI_Reduce_scatter");
}

template <class T>
ProcessGroup::Pending ProcessGroup::start_all_gather(const T* send, T* recv, const std::vector<int64_t>& counts,
                                                     const std::vector<int64_t>& displs) const {
  TRILLION_CHECK(static_cast<int>(counts.size()) == size_ && displs.size() == counts.size(), counts.size(),
                 " counts for ", size_, " ranks");
  Pending pending;
  pending.call = "MPI_Allgatherv";
  const bool in_place = send == recv + displs[rank_];
  if (size_ == 1) {
    if (!in_place) std::copy(send, send + counts[0], recv + displs[0]);
    return pending;
  }
  pending.recv_counts = int_counts(counts);
  pending.recv_displs = int_counts(displs);
  check_mpi(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, pending.recv_counts[rank_], mpi_type<T>(), recv,
                            pending.recv_counts.data(),
                            pending.recv_displs.data(), mpi_type<T>(), comm(), &pending.request),
            "MPI_Iallgatherv");
  return pending;
}

template <class T>
void ProcessGroup::all_gather(const T* send, T* recv, const std::vector<int64_t>& counts,
                              const std::vector<int64_t>& displs) const {
  Pending pending = start_all_gather(send, recv, counts, displs);
  finish(pending);
}

template <class T>
ProcessGroup::Pending ProcessGroup::start_all_to_all(const T* send, const std::vector<int64_t>& send_counts, T* recv,
                                                     const std::vector<int64_t>& recv_counts) const {
  TRILLION_CHECK(static_cast<int>(send_counts.size()) == size_ && recv_counts.size() == send_counts.size(),
                 send_counts.size(), " counts for ", size_, " ranks");
  Pending pending;
  pending.call = "MPI_Alltoallv";
  if (size_ == 1) {
    std::copy(send, send + send_counts[0], recv);
    return pending;
  }
  std::vector<int64_t> send_displs(size_, 0), recv_displs(size_, 0);
  for (int r = 1; r < size_; ++r) {
    send_displs[r] = send_displs[r - 1] + send_counts[r - 1];
    recv_displs[r] = recv_displs[r - 1] + recv_counts[r - 1];
  }
  pending.send_counts = int_counts(send_counts);
  pending.send_displs = int_counts(send_displs);
  pending.recv_counts = int_counts(recv_counts);
  pending.recv_displs = int_counts(recv_displs);
  check_mpi(MPI_Ialltoallv(send, pending.send_counts.data(), pending.send_displs.data(), mpi_type<T>(), recv,
                           pending.recv_counts.data(), pending.recv_displs.data(), mpi_type<T>(), comm(),
                           &pending.request),
            "MPI_Ialltoallv");
  return pending;
}

void ProcessGroup::finish(Pending& pending) const {
  if (pending.request != MPI_REQUEST_NULL) wait(pending.request, pending.call);
}

void ProcessGroup::broadcast(std::string& text) const {
  if (size_ == 1) return;
  int64_t length = rank_ == 0 ? static_cast<int64_t>(text.size()) : 0;
  MPI_Request request;
  check_mpi(MPI_Ibcast(&length, 1, MPI_INT64_T, 0, comm(), &request), "MPI_Ibcast");
  wait(request, "MPI_Bcast");
  text.resize(length);
  const std::vector<int> ints = int_counts({length});
  check_mpi(MPI_Ibcast(text.data(), ints[0], MPI_CHAR, 0, comm(), &request), "MPI_Ibcast");
  wait(request, "MPI_Bcast");
}

void ProcessGroup::barrier() const {
  if (size_ == 1) return;
  MPI_Request request;
  check_mpi(MPI_Ibarrier(comm(), &request), "MPI_Ibarrier");
  wait(request, "MPI_Barrier");
}

template <class T>
std::vector<T> ProcessGroup::all_gather_values(const std::vector<T>& values) const {
  if (size_ == 1) return values;
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<T> all(size_ * n);  // [size, n]
  MPI_Request request;
  check_mpi(MPI_Iallgather(values.data(), int_counts({n})[0], mpi_type<T>(), all.data(), static_cast<int>(n),
                           mpi_type<T>(), comm(), &request),
            "MPI_Iallgather");
  wait(request, "MPI_Allgather");
  return all;
}

template std::vector<int64_t> ProcessGroup::all_gather_values<int64_t>(const std::vector<int64_t>&) const;
template std::vector<double> ProcessGroup::all_gather_values<double>(const std::vector<double>&) const;

void ProcessGroup::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) const {
  if (size_ == 1) {
    std::copy(send, send + n, recv);
    return;
  }
  MPI_Request request;
  check_mpi(MPI_Ialltoall(send, static_cast<int>(n), MPI_INT64_T, recv, static_cast<int>(n), MPI_INT64_T, comm(),
                          &request),
            "MPI_Ialltoall");
  wait(request, "MPI_Alltoall");
}

template ProcessGroup::Pending ProcessGroup::start_all_to_all<float>(const float*, const std::vector<int64_t>&,
                                                                     float*, const std::vector<int64_t>&) const;
template ProcessGroup::Pending ProcessGroup::start_all_to_all<double>(const double*, const std::vector<int64_t>&,
                                                                      double*, const std::vector<int64_t>&) const;
template void ProcessGroup::reduce_scatter_sum<float>(const float*, float*, const std::vector<int64_t>&) const;
template void ProcessGroup::reduce_scatter_sum<double>(const double*, double*, const std::vector<int64_t>&) const;
template ProcessGroup::Pending ProcessGroup::start_all_gather<float>(const float*, float*, const std::vector<int64_t>&,
                                                                     const std::vector<int64_t>&) const;
template ProcessGroup::Pending ProcessGroup::start_all_gather<double>(const double*, double*,
                                                                      const std::vector<int64_t>&,
                                                                      const std::vector<int64_t>&) const;
template ProcessGroup::Pending ProcessGroup::start_all_gather<bf16>(const bf16*, bf16*, const std::vector<int64_t>&,
                                                                    const std::vector<int64_t>&) const;
template void ProcessGroup::all_gather<float>(const float*, float*, const std::vector<int64_t>&,
                                              const std::vector<int64_t>&) const;
template void ProcessGroup::all_gather<double>(const double*, double*, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) const;

void ProcessGroup::abort_all(const std::string& message, int code) const {
  TRILLION_CHECK(uses_mpi_, "abort_all outside MPI");
  std::fprintf(stderr, "error: %s: %s\n", world().describe().c_str(), message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return
}

void finalize_processes() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized != 0 && finalized == 0) MPI_Finalize();
}

}  // namespace trillion
