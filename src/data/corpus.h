// Corpus: the documents of the text that `trillion tokenize` reads, streamed file by file.
//
// Inputs: files, directories (every regular file under them whose name does not start with '.',
// in byte order of the path) and glob patterns (glob(3), sorted); each file plain or compressed
// (".gz", ".zst": data/line_reader.h). The files' kinds, by name without the compression suffix:
//   - JSONL (".jsonl", ".ndjson"): one JSON object per line (blank lines are skipped), each
//       {"messages": [{"role": "system" | "user" | "assistant", "content": …}, …]}: a
//         conversation rendered in ChatML, "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message
//         (the built-in chat format), whose loss targets are the assistant turns' CONTENT and
//         <|im_end|>, every assistant turn;
//       {"prompt": …, "completion": …}: the prompt (not a target) then the completion;
//       else the string field `text_field` (verbatim), all of it a target;
//   - text, one document per line (doc_per_line): each line not only whitespace, plus "\n";
//   - a fortune file: a text file with a line of "%" alone in its first 64 KiB; its "%" lines
//     separate documents;
//   - text: documents are paragraphs, split at lines of only whitespace.
// A document is a list of parts, each text with whether its tokens are loss targets (one part, a
// target, for everything but the fine-tuning forms above). A text document is its lines verbatim, each ending in "\n". Documents of only whitespace are
// dropped. There is no limit on a document's length.
//
// Bad input is an error naming the file and line: invalid UTF-8, a JSONL line that is not valid
// JSON, not an object, or lacks the string field. With skip_bad the document is dropped instead
// and counted by kind.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trillion {

// ChatML's markers: a tokenizer for conversations must hold each as one piece.
inline constexpr const char* kChatStart = "<|im_start|>";
inline constexpr const char* kChatEnd = "<|im_end|>";

struct DocumentPart {
  std::string_view text;
  bool target = true;  // its tokens are loss targets
};

struct CorpusOptions {
  bool doc_per_line = false;
  std::string text_field = "text";
  bool skip_bad = false;
};

// What a pass over the corpus read and dropped.
struct CorpusCounts {
  int64_t files = 0;
  int64_t bytes = 0;  // decompressed bytes read
  int64_t documents = 0;
  int64_t invalid_utf8 = 0;   // documents dropped for invalid UTF-8 (skip_bad)
  int64_t invalid_json = 0;   // JSONL lines that are not JSON objects (skip_bad)
  int64_t missing_field = 0;  // JSONL objects without the string field (skip_bad)
  int64_t prompt_completions = 0;  // documents of the fine-tuning forms
  int64_t conversations = 0;
  int64_t skipped() const { return invalid_utf8 + invalid_json + missing_field; }
};

// The files of `inputs` in order (each input expanded as above). Errors: an input that is not a
// file, a directory or a pattern matching some file, or a directory with no files.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

// Whether `text` holds nothing but ASCII whitespace (space, \t, \n, \v, \f, \r).
bool is_whitespace_only(std::string_view text);

// The offset of the first byte of `text` that is not part of valid UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF are invalid), or npos.
size_t invalid_utf8_offset(std::string_view text);

// Calls visit(parts, bytes_read) for every document of `files`, in order (the views are valid
// during the call; bytes_read: the corpus bytes consumed so far, for progress). Returns the counts
// of the pass.
using DocumentVisitor = std::function<void(std::span<const DocumentPart> parts, int64_t bytes_read)>;
CorpusCounts for_each_document(const std::vector<std::string>& files, const CorpusOptions& options,
                               const DocumentVisitor& visit);

}  // namespace trillion
