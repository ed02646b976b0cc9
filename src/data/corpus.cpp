// Corpus documents from text, fortune and JSONL files, streamed. See corpus.h.
#include "data/corpus.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/line_reader.h"

namespace trillion {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFortuneProbeBytes = 64 << 10;  // a "%" line within this many bytes: a fortune file

bool is_percent(std::string_view line) { return line == "%" || line == "%\r"; }

bool is_jsonl(const std::string& path) {
  const std::string name = strip_compression_suffix(path);
  return name.ends_with(".jsonl") || name.ends_with(".ndjson");
}

bool is_pattern(const std::string& input) { return input.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> files_under(const std::string& directory) {
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(directory); it != fs::recursive_directory_iterator(); ++it) {
    if (it->path().filename().string().rfind('.', 0) == 0) {  // hidden: not read, nor descended into
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (status == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      if (fs::is_regular_file(matches.gl_pathv[i])) files.push_back(matches.gl_pathv[i]);
    }
  }
  globfree(&matches);
  return files;  // glob sorts its matches
}

// One file's documents: the rules of corpus.h, with the pass's counts.
class FileDocuments {
 public:
  FileDocuments(const std::string& path, const CorpusOptions& options, CorpusCounts& counts, int64_t bytes_before,
                const DocumentVisitor& visit)
      : reader_(path), options_(options), counts_(counts), bytes_before_(bytes_before), visit_(visit) {}

  void read() {
    if (is_jsonl(reader_.path())) return read_jsonl();
    // A fortune file shows a "%" line early: the lines of the first 64 KiB wait for the verdict.
    std::deque<std::pair<std::string, int64_t>> probe;  // lines and their numbers
    std::string_view line;
    bool fortune = false, more = true;
    while (!fortune && reader_.bytes_read() < kFortuneProbeBytes && (more = reader_.next(line))) {
      fortune = is_percent(line);
      probe.emplace_back(std::string(line), reader_.line_number());
    }
    for (const auto& [text, number] : probe) text_line(text, number, fortune);
    while (more && reader_.next(line)) text_line(line, reader_.line_number(), fortune);
    finish_document();
  }
  int64_t bytes_read() const { return reader_.bytes_read(); }

 private:
  [[noreturn]] void fail_at(int64_t line_number, const std::string& what) const {
    fail(reader_.path(), ":", line_number, ": ", what, " (--skip-bad skips such documents)");
  }
  // Without skip_bad: the error naming the file and line; with it, one more of `counter`.
  void fail_or_skip(int64_t line_number, int64_t& counter, const std::string& what) const {
    if (!options_.skip_bad) fail_at(line_number, what);
    ++counter;
  }

  static std::string utf8_error(std::string_view line, size_t bad) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(line[bad])));
    return std::string("invalid UTF-8 (byte ") + byte + " at column " + std::to_string(bad + 1) + ")";
  }

  void text_line(std::string_view line, int64_t line_number, bool fortune) {
    if (!options_.doc_per_line && (fortune ? is_percent(line) : is_whitespace_only(line))) return finish_document();
    if (const size_t bad = invalid_utf8_offset(line); bad != std::string_view::npos) {
      if (!options_.skip_bad) fail_at(line_number, utf8_error(line, bad));
      bad_document_ = true;  // counted once, when the document ends
    }
    document_.append(line);
    document_ += '\n';
    if (options_.doc_per_line) finish_document();
  }

  void finish_document() {
    if (bad_document_) {
      ++counts_.invalid_utf8;
    } else if (!is_whitespace_only(document_)) {
      emit(document_);
    }
    document_.clear();
    bad_document_ = false;
  }

  void emit(std::string_view document) {
    const DocumentPart part{document, true};
    emit_parts(std::span<const DocumentPart>(&part, 1));
  }
  void emit_parts(std::span<const DocumentPart> parts) {
    ++counts_.documents;
    visit_(parts, bytes_before_ + reader_.bytes_read());
  }

  // A string field of a JSONL object, or null (after the error or the count of skip_bad).
  const std::string* string_of(const nlohmann::json& object, const char* name, int64_t line_number) {
    const auto it = object.find(name);
    if (it != object.end() && it->is_string()) return &it->get_ref<const std::string&>();
    fail_or_skip(line_number, counts_.missing_field, std::string("no string field \"") + name + "\"");
    return nullptr;
  }

  // {"prompt", "completion"}: the prompt, not a target, then the completion.
  void emit_prompt_completion(const nlohmann::json& object, int64_t line_number) {
    const std::string* prompt = string_of(object, "prompt", line_number);
    const std::string* completion = prompt != nullptr ? string_of(object, "completion", line_number) : nullptr;
    if (completion == nullptr) return;
    ++counts_.prompt_completions;
    const DocumentPart parts[] = {{*prompt, false}, {*completion, true}};
    emit_parts(parts);
  }

  // {"messages": […]} in ChatML; the assistant turns' content and end marker are the targets.
  void emit_conversation(const nlohmann::json& messages, int64_t line_number) {
    if (!messages.is_array() || messages.empty()) {
      return fail_or_skip(line_number, counts_.invalid_json, "field \"messages\" is not a non-empty array");
    }
    chat_text_.clear();
    for (const nlohmann::json& message : messages) {
      const std::string* role = string_of(message, "role", line_number);  // a non-object has no fields
      const std::string* content = role != nullptr ? string_of(message, "content", line_number) : nullptr;
      if (content == nullptr) return;
      if (*role != "system" && *role != "user" && *role != "assistant") {
        return fail_or_skip(line_number, counts_.invalid_json,
                            "message role \"" + *role + "\" (expected system, user or assistant)");
      }
      const bool assistant = *role == "assistant";
      chat_text_.push_back({std::string(kChatStart) + *role + "\n", false});
      chat_text_.push_back({*content, assistant});
      chat_text_.push_back({kChatEnd, assistant});
      chat_text_.push_back({"\n", false});
    }
    std::vector<DocumentPart> parts;
    for (const auto& [text, target] : chat_text_) parts.push_back({text, target});
    ++counts_.conversations;
    emit_parts(parts);
  }

  void read_jsonl() {
    std::string_view line;
    while (reader_.next(line)) {
      if (is_whitespace_only(line)) continue;
      const int64_t number = reader_.line_number();
      if (const size_t bad = invalid_utf8_offset(line); bad != std::string_view::npos) {
        fail_or_skip(number, counts_.invalid_utf8, utf8_error(line, bad));
        continue;
      }
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        const std::string what = e.what();  // without its echo of the line ("; last read: …")
        fail_or_skip(number, counts_.invalid_json, "not valid JSON (" + what.substr(0, what.find("; last read")) + ")");
        continue;
      }
      if (!object.is_object()) {
        fail_or_skip(number, counts_.invalid_json, "not a JSON object (expected one object per line)");
        continue;
      }
      if (object.contains("messages")) {
        emit_conversation(object.at("messages"), number);
        continue;
      }
      if (object.contains("prompt") || object.contains("completion")) {
        emit_prompt_completion(object, number);
        continue;
      }
      const auto field = object.find(options_.text_field);
      if (field == object.end() || !field->is_string()) {
        fail_or_skip(number, counts_.missing_field,
                     "no string field \"" + options_.text_field + "\" (--text-field names the document's field)");
        continue;
      }
      const std::string& text = field->get_ref<const std::string&>();
      if (!is_whitespace_only(text)) emit(text);
    }
  }

  LineReader reader_;
  const CorpusOptions& options_;
  CorpusCounts& counts_;
  int64_t bytes_before_;
  const DocumentVisitor& visit_;
  std::string document_;
  bool bad_document_ = false;  // the text document being read has invalid UTF-8 (skip_bad)
  std::vector<std::pair<std::string, bool>> chat_text_;  // the rendered conversation's parts
};

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::vector<std::string> found;
    if (fs::is_regular_file(input)) {
      found = {input};
    } else if (fs::is_directory(input)) {
      found = files_under(input);
      if (found.empty()) fail(input, ": input directory holds no files (--input)");
    } else if (is_pattern(input)) {
      found = glob_files(input);
      if (found.empty()) fail(input, ": input pattern matches no file (--input)");
    } else {
      fail(input, ": input file not found (--input)");
    }
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

bool is_whitespace_only(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
}

size_t invalid_utf8_offset(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = bytes[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: the sequence length and the valid range of the second byte (RFC 3629 table).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;   // no overlong forms
      if (c == 0xED) high = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;   // no overlong forms
      if (c == 0xF4) high = 0x8F;  // nothing past U+10FFFF
    } else {
      return i;
    }
    if (i + length > n || bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

CorpusCounts for_each_document(const std::vector<std::string>& files, const CorpusOptions& options,
                               const DocumentVisitor& visit) {
  CorpusCounts counts;
  for (const std::string& path : files) {
    FileDocuments documents(path, options, counts, counts.bytes, visit);
    documents.read();
    counts.bytes += documents.bytes_read();
    ++counts.files;
  }
  return counts;
}

}  // namespace trillion
