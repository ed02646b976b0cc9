// check_failed: the one place internal invariant failures end the process.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace trillion {
namespace {
AbortHandler g_abort_handler = nullptr;
}

void set_abort_handler(AbortHandler handler) { g_abort_handler = handler; }

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s%s%s\n", file, line, condition, message.empty() ? "" : ": ",
               message.c_str());
  std::fflush(stderr);
  if (g_abort_handler != nullptr) g_abort_handler();
  std::abort();
}

std::string one_of(const std::vector<std::string>& choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); ++i) {
    text += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    text += choices[i];
  }
  return text;
}

}  // namespace trillion
