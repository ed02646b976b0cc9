// Shared by the bench tests: running `trillion bench …` (through test::run_shell, which this
// brings in) and reading its JSON lines.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support/command.h"

namespace trillion::test {

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
