// HfTokenizer: a Hugging Face `tokenizer.json` of the byte-level BPE kind that Qwen2/Qwen3 and
// DeepSeek models ship, encoding and decoding as the `tokenizers` library does.
//
// What is read (anything else is an error naming the file and field):
//   normalizer     null, NFC (utf8proc), or a Sequence of those;
//   pre_tokenizer  Split (a Regex or String pattern, through PCRE2 in UTF and Unicode-property mode,
//                  so \p{L}, \s, … mean what they mean in `tokenizers`; behaviours Isolated,
//                  Removed, MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
//                  (add_prefix_space; use_regex: GPT-2's pattern), or a Sequence of those;
//   model          BPE: vocab, merges (["a", "b"] or "a b"), ignore_merges; no unk, no byte
//                  fallback, no subword prefix or suffix;
//   added_tokens   content, id, special, lstrip, rstrip, normalized, single_word;
//   decoder        ByteLevel (or null).
// Encoding: the text is cut at added tokens (leftmost, longest first; those with normalized false
// on the raw text, the others on the normalized text), each other piece normalized,
// pre-tokenized, byte-mapped and merged by BPE. Decoding joins the tokens and maps their
// characters back to bytes (a token with a character outside the byte map, as added tokens may
// have, stands for its own UTF-8 bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trillion {

class HfTokenizer {
 public:
  explicit HfTokenizer(const std::string& path);  // throws trillion::Error naming the path and field
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  int64_t vocab_size() const;  // one past the largest id of the vocab and the added tokens
  std::optional<int32_t> token_id(const std::string& content) const;  // a vocab or added token
  std::vector<int32_t> encode(const std::string& text) const;  // added tokens recognized, no others added
  // The same ids, and the byte offset in `text` where each token begins (for a piece the
  // normalizer changed, the piece's first byte).
  std::vector<int32_t> encode_with_offsets(const std::string& text, std::vector<uint32_t>& begins) const;
  std::string decode(const std::vector<int32_t>& ids) const;   // throws on an unknown id

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trillion
