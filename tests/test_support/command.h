// The tests' one helper for running a command: run_shell runs a command line through the shell
// (popen) and returns its exit status and what it wrote to stdout. Helpers that add meaning, such
// as run_cli (tests/train/cli_fixture.h: the trillion binary and its environment), call it.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace trillion::test {

struct CommandResult {
  int status = -1;     // the exit status; -1 if the command did not start or did not exit (a signal)
  std::string output;  // its stdout, with stderr where the command line redirects it there (2>&1)
};

// Runs a shell command line and collects its stdout (and what the line redirects into it).
inline CommandResult run_shell(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace trillion::test
