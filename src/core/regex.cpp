// PCRE2 behind core/regex.h: patterns compiled once (JIT where the library has it), match data
// per call, so one Regex serves several threads.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace trillion {

Regex::Regex(const std::string& pattern, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                        &offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail(where, ": pattern does not compile at offset ", offset, ": ", reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // a plain match when JIT is unavailable
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    pcre2_code_free(code_);
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

Regex::~Regex() { pcre2_code_free(code_); }

std::vector<std::pair<size_t, size_t>> Regex::matches(const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
  for (size_t at = 0; at <= text.size();) {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0, data, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    if (ovector[1] == ovector[0]) {  // empty: move on one character
      at = ovector[0] + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    out.emplace_back(ovector[0], ovector[1]);
    at = ovector[1];
  }
  pcre2_match_data_free(data);
  return out;
}

bool Regex::full_match(const std::string& text) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
  // Anchored at both ends: the match must start at 0 and end at the text's end, as
  // re.fullmatch asks (backtracking into shorter alternatives where a longer one falls short).
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, data, nullptr);
  pcre2_match_data_free(data);
  return rc >= 0;
}

}  // namespace trillion
