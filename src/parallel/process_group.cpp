// The MPI-backed process group and its single-rank form. See process_group.h.
#include "parallel/process_group.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

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

template <class T>
void sum_in_pieces(T* values, int64_t count, MPI_Datatype type) {
  for (int64_t at = 0; at < count; at += kMaxPiece) {
    const int piece = static_cast<int>(std::min(kMaxPiece, count - at));
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values + at, piece, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

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
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size_);
    return g;
  }();
  return group;
}

std::string ProcessGroup::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

void ProcessGroup::all_reduce_sum(double* values, int64_t count) const {
  if (size_ > 1) sum_in_pieces(values, count, MPI_DOUBLE);
}

void ProcessGroup::all_reduce_sum(float* values, int64_t count) const {
  if (size_ > 1) sum_in_pieces(values, count, MPI_FLOAT);
}

int64_t ProcessGroup::all_reduce_sum(int64_t value) const {
  if (size_ > 1) sum_in_pieces(&value, 1, MPI_INT64_T);
  return value;
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
  check_mpi(MPI_Reduce_scatter(send, recv, ints.data(), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD), "MPI_Reduce_scatter");
}

template <class T>
void ProcessGroup::all_gather(const T* send, T* recv, const std::vector<int64_t>& counts,
                              const std::vector<int64_t>& displs) const {
  TRILLION_CHECK(static_cast<int>(counts.size()) == size_ && displs.size() == counts.size(), counts.size(),
                 " counts for ", size_, " ranks");
  if (size_ == 1) {
    std::copy(send, send + counts[0], recv + displs[0]);
    return;
  }
  const std::vector<int> ints = int_counts(counts), offsets = int_counts(displs);
  check_mpi(MPI_Allgatherv(send, ints[rank_], mpi_type<T>(), recv, ints.data(), offsets.data(), mpi_type<T>(),
                           MPI_COMM_WORLD),
            "MPI_Allgatherv");
}

template void ProcessGroup::reduce_scatter_sum<float>(const float*, float*, const std::vector<int64_t>&) const;
template void ProcessGroup::reduce_scatter_sum<double>(const double*, double*, const std::vector<int64_t>&) const;
template void ProcessGroup::all_gather<float>(const float*, float*, const std::vector<int64_t>&,
                                              const std::vector<int64_t>&) const;
template void ProcessGroup::all_gather<double>(const double*, double*, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) const;

void ProcessGroup::abort_all(const std::string& message, int code) const {
  TRILLION_CHECK(uses_mpi_, "abort_all outside MPI");
  std::fprintf(stderr, "error: %s: %s\n", describe().c_str(), message.c_str());
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
