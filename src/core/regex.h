// Regular expressions through PCRE2 (UTF and Unicode-property mode), whose syntax is the one
// Python's `re` and the Rust `regex`/`onig` patterns of tokenizer.json files are written in: a
// tokenizer's Split patterns (data/hf_tokenizer.cpp) and PEFT's module-name patterns
// (model/lora_config.h).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace trillion {

class Regex {
 public:
  // Compiles `pattern`; a pattern that does not compile fails naming `where` and the offset.
  Regex(const std::string& pattern, const std::string& where);
  Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // [begin, end) of each non-overlapping match, left to right (empty matches skipped).
  std::vector<std::pair<size_t, size_t>> matches(const std::string& text) const;
  // Whether the pattern matches the whole of `text` (Python's re.fullmatch).
  bool full_match(const std::string& text) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace trillion
