// Byte-level BPE from a Hugging Face tokenizer.json: loading, added tokens, NFC, Split and
// ByteLevel pre-tokenizers, BPE merges, decoding. See hf_tokenizer.h.
#include "data/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regex.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

using Json = nlohmann::json;

// GPT-2's pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t code_point) {
  utf8proc_uint8_t bytes[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(n));
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + k.
struct ByteMap {
  std::string of_byte[256];                     // UTF-8 of each byte's character
  std::unordered_map<uint32_t, uint8_t> byte_of;  // the inverse, by code point
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t code_point = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      append_utf8(of_byte[b], code_point);
      byte_of[code_point] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// The code points of valid UTF-8 `text`, each as its UTF-8 bytes.
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                                static_cast<utf8proc_ssize_t>(text.size() - i), &code_point);
    const size_t length = n > 0 ? static_cast<size_t>(n) : 1;
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

struct SplitStep {
  Regex regex;
  SplitBehavior behavior;
  bool invert;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false, normalized = false, single_word = false;
};

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A word character, as single_word tokens see one: a Unicode letter or number, or '_'.
bool is_word_character(utf8proc_int32_t code_point) {
  if (code_point == '_') return true;
  switch (utf8proc_category(code_point)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// Whether the character starting at byte `at` of `text` (or ending just before it) is a word character.
bool word_character_at(const std::string& text, size_t at) {
  if (at >= text.size()) return false;
  utf8proc_int32_t code_point = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                   static_cast<utf8proc_ssize_t>(text.size() - at), &code_point);
  return is_word_character(code_point);
}
bool word_character_before(const std::string& text, size_t at) {
  if (at == 0) return false;
  size_t start = at - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return word_character_at(text, start);
}

const Json& field(const Json& object, const char* name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) fail(where, ": field '", name, "' is missing");
  return object.at(name);
}

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  bool nfc = false;
  std::vector<SplitStep> splits;  // in order; ByteLevel comes after them
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<std::string, int32_t> merge_rank;  // "a b" → rank
  bool ignore_merges = false;
  std::vector<AddedToken> added;       // longest first
  bool starts_added[2][256] = {};      // [normalized] whether some added token begins with the byte
  std::vector<std::string> id_token;   // [vocab_size] the token of each id ("" where none)

  void read_normalizer(const Json& n) {
    if (n.is_null()) return;
    const std::string type = field(n, "type", path + " normalizer");
    if (type == "NFC") {
      nfc = true;
    } else if (type == "Sequence") {
      for (const Json& inner : field(n, "normalizers", path + " normalizer")) read_normalizer(inner);
    } else {
      fail(path, ": normalizer type \"", type, "\" is not supported (expected NFC, or a Sequence of them)");
    }
  }

  void read_pre_tokenizer(const Json& p) {
    const std::string where = path + " pre_tokenizer";
    const std::string type = field(p, "type", where);
    if (type == "Sequence") {
      for (const Json& inner : field(p, "pretokenizers", where)) read_pre_tokenizer(inner);
    } else if (type == "Split") {
      const Json& pattern = field(p, "pattern", where);
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = pattern.at("Regex").get<std::string>();
      } else {  // a literal string
        for (const char c : field(pattern, "String", where).get<std::string>()) {
          if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) regex += '\\';
          regex += c;
        }
      }
      static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
          {"Isolated", SplitBehavior::isolated},
          {"Removed", SplitBehavior::removed},
          {"MergedWithPrevious", SplitBehavior::merged_with_previous},
          {"MergedWithNext", SplitBehavior::merged_with_next},
          {"Contiguous", SplitBehavior::contiguous}};
      const std::string behavior = field(p, "behavior", where);
      if (!kBehaviors.count(behavior)) fail(where, ": Split behavior \"", behavior, "\" is not known");
      splits.push_back({Regex(regex, where), kBehaviors.at(behavior), p.value("invert", false)});
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false))
        fail(where, ": ByteLevel add_prefix_space true is not supported (expected false, as Qwen and DeepSeek have)");
      if (p.value("use_regex", true)) splits.push_back({Regex(kGpt2Pattern, where), SplitBehavior::isolated, false});
    } else {
      fail(where, ": type \"", type, "\" is not supported (expected Split, ByteLevel or a Sequence of them)");
    }
  }

  void read_model(const Json& m) {
    const std::string where = path + " model";
    if (field(m, "type", where) != "BPE") fail(where, ": type ", m.at("type").dump(), " is not supported (expected \"BPE\")");
    if (m.value("byte_fallback", false)) fail(where, ": byte_fallback true is not supported");
    for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix", "unk_token"}) {
      if (m.contains(name) && !m.at(name).is_null() && m.at(name) != "")
        fail(where, ": field '", name, "' ", m.at(name).dump(), " is not supported (expected null)");
    }
    ignore_merges = m.value("ignore_merges", false);
    for (const auto& [token, id] : field(m, "vocab", where).items()) vocab[token] = id.get<int32_t>();
    int32_t rank = 0;
    for (const Json& merge : field(m, "merges", where)) {
      const std::string key = merge.is_array() ? merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>()
                                               : merge.get<std::string>();
      merge_rank.emplace(key, rank++);
    }
  }

  // BPE of one byte-mapped pre-token that begins at byte `begin` of the text; with begins, each
  // token's first byte (every mapped character stands for one byte).
  void bpe(const std::string& word, size_t begin, std::vector<int32_t>& out, std::vector<uint32_t>* begins) const {
    if (ignore_merges) {
      if (const auto it = vocab.find(word); it != vocab.end()) {
        if (begins != nullptr) begins->push_back(static_cast<uint32_t>(begin));
        return out.push_back(it->second);
      }
    }
    std::vector<std::string> symbols = characters(word);
    std::vector<int32_t> rank;  // [symbols − 1] the merge rank of each adjacent pair (INT32_MAX: none)
    for (;;) {
      rank.assign(symbols.empty() ? 0 : symbols.size() - 1, INT32_MAX);
      for (size_t i = 0; i < rank.size(); ++i) {
        const auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
        if (it != merge_rank.end()) rank[i] = it->second;
      }
      const int32_t best = rank.empty() ? INT32_MAX : *std::min_element(rank.begin(), rank.end());
      if (best == INT32_MAX) break;
      std::vector<std::string> merged;  // every occurrence of the best pair, left to right
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i < rank.size() && rank[i] == best) {
          merged.push_back(symbols[i] + symbols[i + 1]);
          ++i;
          continue;
        }
        merged.push_back(symbols[i]);
      }
      symbols = std::move(merged);
    }
    for (const std::string& symbol : symbols) {
      const auto it = vocab.find(symbol);
      if (it == vocab.end()) fail(path, ": no vocab entry for the piece \"", symbol, "\" (BPE without unk_token)");
      out.push_back(it->second);
      if (begins != nullptr) begins->push_back(static_cast<uint32_t>(begin));
      begin += characters(symbol).size();
    }
  }

  std::string normalize(const std::string& text) const {
    if (!nfc || text.empty()) return text;
    utf8proc_uint8_t* normalized = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
    if (normalized == nullptr) fail(path, ": cannot normalize text that is not valid UTF-8");
    std::string out(reinterpret_cast<const char*>(normalized));
    std::free(normalized);
    return out;
  }

  // The pre-tokens of a normalized piece, each with its byte offset in the piece: each Split in
  // turn, by its behaviour.
  using Pieces = std::vector<std::pair<std::string, size_t>>;
  Pieces pre_tokenize(const std::string& text) const {
    Pieces pieces = {{text, 0}};
    for (const SplitStep& step : splits) {
      Pieces next;
      for (const auto& [piece, offset] : pieces) {
        std::vector<std::pair<std::string, bool>> parts;  // text, is a match (after invert)
        std::vector<size_t> part_offset;
        size_t at = 0;
        for (const auto& [begin, end] : step.regex.matches(piece)) {
          if (begin > at) {
            parts.emplace_back(piece.substr(at, begin - at), step.invert);
            part_offset.push_back(offset + at);
          }
          parts.emplace_back(piece.substr(begin, end - begin), !step.invert);
          part_offset.push_back(offset + begin);
          at = end;
        }
        if (at < piece.size()) {
          parts.emplace_back(piece.substr(at), step.invert);
          part_offset.push_back(offset + at);
        }
        Pieces out;
        bool glue_next = false;  // MergedWithNext: the last match waits for the next part
        for (size_t i = 0; i < parts.size(); ++i) {
          const auto& [part, match] = parts[i];
          const std::pair<std::string, size_t> own = {part, part_offset[i]};
          switch (step.behavior) {
            case SplitBehavior::isolated: out.push_back(own); break;
            case SplitBehavior::removed:
              if (!match) out.push_back(own);
              break;
            case SplitBehavior::merged_with_previous:
              if (match && !out.empty()) out.back().first += part;
              else out.push_back(own);
              break;
            case SplitBehavior::merged_with_next:
              if (glue_next) out.back().first += part;
              else out.push_back(own);
              glue_next = match;
              break;
            case SplitBehavior::contiguous:
              if (match && i > 0 && parts[i - 1].second) out.back().first += part;
              else out.push_back(own);
              break;
          }
        }
        for (auto& p : out) {
          if (!p.first.empty()) next.push_back(std::move(p));
        }
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  // A normalized piece that begins at byte `begin` of the text (exact: the normalizer left it as
  // it was; else its tokens all begin at `begin`).
  void encode_piece(const std::string& piece, size_t begin, bool exact, std::vector<int32_t>& out,
                    std::vector<uint32_t>* begins) const {
    for (const auto& [pre_token, offset] : pre_tokenize(piece)) {
      std::string mapped;
      for (const char c : pre_token) mapped += byte_map().of_byte[static_cast<unsigned char>(c)];
      const size_t first = out.size();
      bpe(mapped, begin + offset, out, begins);
      if (!exact && begins != nullptr) std::fill(begins->begin() + first, begins->end(), static_cast<uint32_t>(begin));
    }
  }

  void encode(const std::string& text, std::vector<int32_t>& ids, std::vector<uint32_t>* begins) const {
    split_added(text, 0, /*normalized=*/false, ids, begins, [&](const std::string& raw, size_t at) {
      const std::string normalized = normalize(raw);
      const bool exact = normalized == raw;
      split_added(normalized, at, /*normalized=*/true, ids, begins, [&](const std::string& piece, size_t from) {
        encode_piece(piece, exact ? from : at, exact, ids, begins);
      });
    });
  }

  // The earliest (then longest) match of an added token of the `normalized` kind at or after
  // `from`: [begin, end) with lstrip / rstrip whitespace, and the token; end == npos: none.
  std::pair<std::pair<size_t, size_t>, const AddedToken*> find_added(const std::string& text, size_t from,
                                                                     bool normalized) const {
    for (size_t at = from; at < text.size(); ++at) {
      if (!starts_added[normalized][static_cast<unsigned char>(text[at])]) continue;
      for (const AddedToken& token : added) {  // longest first
        if (token.normalized != normalized || text.compare(at, token.content.size(), token.content) != 0) continue;
        size_t begin = at, end = at + token.content.size();
        if (token.single_word && (word_character_before(text, begin) || word_character_at(text, end))) continue;
        if (token.lstrip) {
          while (begin > from && is_space(text[begin - 1])) --begin;
        }
        if (token.rstrip) {
          while (end < text.size() && is_space(text[end])) ++end;
        }
        return {{begin, end}, &token};
      }
    }
    return {{std::string::npos, std::string::npos}, nullptr};
  }

  // Cuts `text` (at byte `base` of the whole) at added tokens of one kind; the pieces between go
  // to piece(text, offset in the whole).
  template <class Piece>
  void split_added(const std::string& text, size_t base, bool normalized, std::vector<int32_t>& out,
                   std::vector<uint32_t>* begins, const Piece& piece) const {
    size_t at = 0;
    for (;;) {
      const auto [range, token] = find_added(text, at, normalized);
      if (token == nullptr) break;
      if (range.first > at) piece(text.substr(at, range.first - at), base + at);
      out.push_back(token->id);
      if (begins != nullptr) begins->push_back(static_cast<uint32_t>(base + range.first));
      at = range.second;
    }
    if (at < text.size()) piece(text.substr(at), base + at);
  }
};

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  Json json;
  try {
    json = Json::parse(read_file(path));
  } catch (const Json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  try {
    m.read_normalizer(json.value("normalizer", Json()));
    if (!json.value("pre_tokenizer", Json()).is_null()) m.read_pre_tokenizer(json.at("pre_tokenizer"));
    m.read_model(field(json, "model", path));
    const Json decoder = json.value("decoder", Json());
    if (!decoder.is_null() && decoder.value("type", "") != "ByteLevel")
      fail(path, ": decoder type ", decoder.value("type", Json()).dump(), " is not supported (expected ByteLevel)");
    for (const Json& t : json.value("added_tokens", Json::array())) {
      m.added.push_back({field(t, "content", path + " added_tokens").get<std::string>(), t.at("id").get<int32_t>(),
                         t.value("lstrip", false), t.value("rstrip", false), t.value("normalized", false),
                         t.value("single_word", false)});
    }
  } catch (const Json::exception& e) {
    fail(path, ": a field has the wrong type (", e.what(), ")");
  }
  for (const AddedToken& token : m.added) {
    if (token.content.empty()) fail(path, ": added token ", token.id, " has empty content");
    m.starts_added[token.normalized][static_cast<unsigned char>(token.content[0])] = true;
  }
  std::stable_sort(m.added.begin(), m.added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  int32_t largest = -1;
  for (const auto& [token, id] : m.vocab) largest = std::max(largest, id);
  for (const AddedToken& token : m.added) largest = std::max(largest, token.id);
  m.id_token.assign(static_cast<size_t>(largest + 1), std::string());
  for (const auto& [token, id] : m.vocab) {
    if (id < 0) fail(path, ": vocab id ", id, " of \"", token, "\" is negative");
    m.id_token[id] = token;
  }
  for (const AddedToken& token : m.added) m.id_token[token.id] = token.content;
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_token.size()); }

std::optional<int32_t> HfTokenizer::token_id(const std::string& content) const {
  for (const AddedToken& token : impl_->added) {
    if (token.content == content) return token.id;
  }
  if (const auto it = impl_->vocab.find(content); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  impl_->encode(text, ids, nullptr);
  return ids;
}

std::vector<int32_t> HfTokenizer::encode_with_offsets(const std::string& text, std::vector<uint32_t>& begins) const {
  std::vector<int32_t> ids;
  begins.clear();
  impl_->encode(text, ids, &begins);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || m.id_token[id].empty())
      fail(m.path, ": cannot decode token id ", id, " (not in the vocab or the added tokens)");
    const std::string& token = m.id_token[id];
    std::string bytes;
    bool mapped = true;
    for (size_t i = 0; i < token.size() && mapped;) {
      utf8proc_int32_t code_point = 0;
      const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data() + i),
                                                  static_cast<utf8proc_ssize_t>(token.size() - i), &code_point);
      const auto it = n > 0 ? byte_map().byte_of.find(static_cast<uint32_t>(code_point)) : byte_map().byte_of.end();
      if (it == byte_map().byte_of.end()) {
        mapped = false;
      } else {
        bytes += static_cast<char>(it->second);
        i += static_cast<size_t>(n);
      }
    }
    text += mapped ? bytes : token;
  }
  return text;
}

}  // namespace trillion
