// Errors, as docs/architecture.md ("Errors") says:
//  - bad input (config, data, checkpoint, CLI) throws trillion::Error with one clear message that
//    names the file, the field and the expected value; main() catches it, prints it, exits non-zero;
//  - internal invariants use TRILLION_CHECK, which prints file, line and condition and aborts;
//  - nothing throws across an OpenMP region (kernels use TRILLION_CHECK only outside them).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace trillion {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates any streamable values into one string: str_cat("expected ", 3, " got ", x).
template <class... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// The choices of an error's "expected …": "a", "a or b", "a, b or c".
std::string one_of(const std::vector<std::string>& choices);

// Throws trillion::Error with the concatenated message.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(str_cat(parts...));
}

// Prints "CHECK failed at FILE:LINE: COND: MESSAGE" to stderr and aborts (MPI_Abort under MPI,
// through the abort handler that parallel/ installs).
[[noreturn]] void check_failed(const char* file, int line, const char* condition, const std::string& message);

// Replaces std::abort() for check_failed; parallel/ sets one that calls MPI_Abort.
using AbortHandler = void (*)();
void set_abort_handler(AbortHandler handler);

}  // namespace trillion

#define TRILLION_CHECK(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond)) ::trillion::check_failed(__FILE__, __LINE__, #cond, ::trillion::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
