// Shared by the bench tests: running `trillion bench …` and reading its JSON lines.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace trillion::test {

// Exit status and stdout of a shell command.
inline std::pair<int, std::string> run_command(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  return {pclose(pipe), output};
}

// Each line of `output` parsed as JSON.
inline std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  size_t begin = 0;
  while (begin < output.size()) {
    const size_t end = output.find('\n', begin);
    lines.push_back(nlohmann::json::parse(output.substr(begin, end - begin)));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return lines;
}

}  // namespace trillion::test
