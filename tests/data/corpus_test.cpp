// The corpus reader: lines of plain, gzip and zstd files alike (lines longer than a read block, a
// last line without '\n', several gzip members and zstd frames), truncated and corrupt compressed
// files refused by name; UTF-8 validation at the first bad byte; inputs expanded from directories
// and globs in order; documents of text, fortune, one-per-line and JSONL files, of any length;
// fine-tuning forms (prompt/completion, ChatML conversations) as parts with their loss targets;
// every kind of bad input an error naming the file and line, or skipped and counted.
#include "data/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "data/line_reader.h"
#include "io/atomic_file.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using test::ScratchDir;
using testing::write_gzip;
using testing::write_zstd;
namespace fs = std::filesystem;

std::vector<std::string> lines_of(const std::string& path) {
  LineReader reader(path);
  std::vector<std::string> lines;
  std::string_view line;
  while (reader.next(line)) {
    lines.emplace_back(line);
    EXPECT_EQ(reader.line_number(), static_cast<int64_t>(lines.size()));
  }
  return lines;
}

TEST(LineReader, PlainGzipAndZstdGiveTheSameLines) {
  ScratchDir dir("line_reader");
  const std::string long_line(3 << 20, 'x');  // three read blocks
  const std::string text = "first\r\n\n" + long_line + "\nlast without newline";
  const std::vector<std::string> expected = {"first\r", "", long_line, "last without newline"};
  write_file_atomic(dir.path("a.txt"), text);
  write_gzip(dir.path("a.txt.gz"), {text.substr(0, 10), text.substr(10)});
  write_zstd(dir.path("a.txt.zst"), {text.substr(0, 1000), text.substr(1000)});
  for (const char* name : {"a.txt", "a.txt.gz", "a.txt.zst"}) EXPECT_EQ(lines_of(dir.path(name)), expected) << name;
  LineReader reader(dir.path("a.txt.zst"));
  std::string_view line;
  while (reader.next(line)) {
  }
  EXPECT_EQ(reader.bytes_read(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(strip_compression_suffix("x/a.jsonl.gz"), "x/a.jsonl");
  EXPECT_EQ(strip_compression_suffix("a.jsonl"), "a.jsonl");
}

TEST(LineReader, TruncatedAndCorruptCompressedFilesAreRefusedByName) {
  ScratchDir dir("line_reader_bad");
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i * 7919 % 10007) + "\n";
  write_gzip(dir.path("t.gz"), {text});
  write_zstd(dir.path("t.zst"), {text});
  const std::string gz = read_file(dir.path("t.gz")), zst = read_file(dir.path("t.zst"));
  write_file_atomic(dir.path("cut.gz"), gz.substr(0, gz.size() / 2));
  write_file_atomic(dir.path("cut.zst"), zst.substr(0, zst.size() / 2));
  std::string flipped = zst;
  flipped[flipped.size() / 2] ^= 0x5A;
  write_file_atomic(dir.path("flipped.zst"), flipped);
  testing::expect_error([&] { lines_of(dir.path("cut.gz")); }, {dir.path("cut.gz"), "truncated gzip data"});
  testing::expect_error([&] { lines_of(dir.path("cut.zst")); }, {dir.path("cut.zst"), "truncated zstd data"});
  testing::expect_error([&] { lines_of(dir.path("flipped.zst")); }, {dir.path("flipped.zst"), "corrupt zstd data"});
  testing::expect_error([&] { lines_of(dir.path("missing.gz")); }, {dir.path("missing.gz"), "cannot open"});
}

TEST(Utf8, TheFirstInvalidByteIsFound) {
  EXPECT_EQ(invalid_utf8_offset("plain ascii, é ß → 日本 😀 \xF4\x8F\xBF\xBF"), std::string_view::npos);
  const std::pair<std::string, size_t> cases[] = {
      {"ab\xFF", 2},              // never a UTF-8 byte
      {"a\xC0\x80", 1},           // overlong NUL
      {"\xE0\x80\x80", 0},        // overlong three-byte form
      {"x\xED\xA0\x80", 1},       // a surrogate
      {"\xF4\x90\x80\x80", 0},    // past U+10FFFF
      {"ok \xE6\x97", 3},         // cut short at the end
      {"\x80 alone", 0},          // a continuation byte without a lead
      {"\xC3\xA9\xC3\x28", 2},    // a bad continuation byte
  };
  for (const auto& [text, offset] : cases) EXPECT_EQ(invalid_utf8_offset(text), offset) << text;
}

TEST(CorpusInputs, DirectoriesAndPatternsExpandInOrder) {
  ScratchDir dir("corpus_inputs");
  fs::create_directories(dir.path("d/sub"));
  fs::create_directories(dir.path("d/.git"));
  for (const char* name : {"d/b.txt", "d/a.txt", "d/sub/c.jsonl", "d/.hidden", "d/.git/x", "p1.txt", "p2.txt"})
    write_file_atomic(dir.path(name), "x\n");
  EXPECT_EQ(expand_inputs({dir.path("d"), dir.path("p*.txt"), dir.path("p1.txt")}),
            (std::vector<std::string>{dir.path("d/a.txt"), dir.path("d/b.txt"), dir.path("d/sub/c.jsonl"),
                                      dir.path("p1.txt"), dir.path("p2.txt"), dir.path("p1.txt")}));
  fs::create_directories(dir.path("empty"));
  testing::expect_error([&] { expand_inputs({dir.path("empty")}); }, {dir.path("empty"), "holds no files"});
  testing::expect_error([&] { expand_inputs({dir.path("q*.txt")}); }, {dir.path("q*.txt"), "matches no file"});
  testing::expect_error([&] { expand_inputs({dir.path("none.txt")}); }, {dir.path("none.txt"), "not found"});
}

// A document as the expectations write it: long ones by size and content summary (so that a
// failure prints a line, not megabytes).
std::string shown(std::string_view document) {
  if (document.size() <= 100) return std::string(document);
  const bool uniform = document.find_first_not_of(document[0]) == std::string_view::npos;
  return "<" + std::to_string(document.size()) + " bytes: " + (uniform ? std::string(1, document[0]) + "…" : "mixed") + ">";
}

std::vector<std::string> documents_of(const std::vector<std::string>& files, const CorpusOptions& options,
                                      CorpusCounts* counts = nullptr) {
  std::vector<std::string> documents;
  int64_t last_bytes = 0;
  const CorpusCounts c = for_each_document(files, options, [&](std::span<const DocumentPart> parts, int64_t bytes) {
    EXPECT_EQ(parts.size(), 1u);
    EXPECT_TRUE(parts[0].target);
    documents.push_back(shown(parts[0].text));
    EXPECT_GE(bytes, last_bytes) << "progress only grows";
    last_bytes = bytes;
  });
  EXPECT_EQ(c.documents, static_cast<int64_t>(documents.size()));
  if (counts != nullptr) *counts = c;
  return documents;
}

TEST(CorpusDocuments, EachFileKindSplitsAsDocumented) {
  ScratchDir dir("corpus_documents");
  const std::string huge(2 << 20, 'w');  // longer than any block or sentence limit
  write_file_atomic(dir.path("plain.txt"), "\n one\ntwo \n \t\n\n" + huge + "\n\nthree");
  write_file_atomic(dir.path("fortune"), "f1\n\nstill f1\n%\nf2\n%\n");
  write_file_atomic(dir.path("lines.txt"), "l1\n\n  \n" + huge + "\r\nl3");
  write_gzip(dir.path("docs.jsonl.gz"), {"{\"text\": \"j1\\n\", \"id\": 1}\n\n", "{\"body\": \"b\", \"text\": \"" + huge + "\"}\n"});
  write_file_atomic(dir.path("other.ndjson"), "{\"body\": \"b1\"}\n{\"body\": \"  \"}\n");
  CorpusOptions options;
  EXPECT_EQ(documents_of({dir.path("plain.txt"), dir.path("fortune"), dir.path("docs.jsonl.gz")}, options),
            (std::vector<std::string>{" one\ntwo \n", shown(huge + "\n"), "three\n", "f1\n\nstill f1\n", "f2\n", "j1\n",
                                      shown(huge)}));
  options.doc_per_line = true;
  EXPECT_EQ(documents_of({dir.path("lines.txt")}, options), (std::vector<std::string>{"l1\n", shown(huge + "\r\n"), "l3\n"}));
  options.text_field = "body";
  EXPECT_EQ(documents_of({dir.path("other.ndjson")}, options), (std::vector<std::string>{"b1"}));
}

TEST(CorpusDocuments, BadInputNamesTheFileAndLineOrIsSkippedAndCounted) {
  ScratchDir dir("corpus_bad");
  write_file_atomic(dir.path("bad.txt"), "good\n\nbad \xFF here\nsame doc\n\nfine\n");
  write_file_atomic(dir.path("bad.jsonl"), "{\"text\": \"a\"}\n[1]\n{\"txt\": \"x\"}\n{\"text\": 5}\n{\"text\": \n"
                                           "{\"text\": \"\xC3\x28\"}\n{\"text\": \"z\"}\n");
  const CorpusOptions strict;
  testing::expect_error([&] { documents_of({dir.path("bad.txt")}, strict); },
                        {dir.path("bad.txt") + ":3: invalid UTF-8 (byte 0xFF at column 5)", "--skip-bad"});
  testing::expect_error([&] { documents_of({dir.path("bad.jsonl")}, strict); },
                        {dir.path("bad.jsonl") + ":2: not a JSON object"});
  CorpusOptions skip;
  skip.skip_bad = true;
  CorpusCounts counts;
  EXPECT_EQ(documents_of({dir.path("bad.txt"), dir.path("bad.jsonl")}, skip, &counts),
            (std::vector<std::string>{"good\n", "fine\n", "a", "z"}));
  EXPECT_EQ(counts.invalid_utf8, 2);  // the text paragraph (once, for its two lines) and the JSONL line
  EXPECT_EQ(counts.invalid_json, 2);  // [1] and the cut object
  EXPECT_EQ(counts.missing_field, 2);
  EXPECT_EQ(counts.files, 2);
  EXPECT_EQ(counts.bytes, static_cast<int64_t>(fs::file_size(dir.path("bad.txt")) + fs::file_size(dir.path("bad.jsonl"))));
  for (const auto& [content, message] : {std::pair<std::string, std::string>{"{\"txt\": 1}\n", ":1: no string field \"text\""},
                                         {"{\"text\": \n", ":1: not valid JSON"}}) {
    write_file_atomic(dir.path("one.jsonl"), content);
    testing::expect_error([&] { documents_of({dir.path("one.jsonl")}, strict); }, {dir.path("one.jsonl") + message});
  }
}

// Prompt/completion and ChatML conversations: parts with their targets, in order.
TEST(CorpusDocuments, FineTuningFormsArePartsWithTheirTargets) {
  ScratchDir dir("corpus_fine_tuning");
  write_file_atomic(dir.path("ft.jsonl"),
                    "{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}\n"
                    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                    "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", "
                    "\"content\": \"Bye\"}, {\"role\": \"assistant\", \"content\": \"Bye!\"}]}\n"
                    "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n"
                    "{\"prompt\": \"p\"}\n");
  std::vector<std::vector<std::pair<std::string, bool>>> documents;
  CorpusOptions options;
  options.skip_bad = true;
  const CorpusCounts counts = for_each_document({dir.path("ft.jsonl")}, options,
                                                [&](std::span<const DocumentPart> parts, int64_t) {
                                                  auto& d = documents.emplace_back();
                                                  for (const DocumentPart& p : parts) d.emplace_back(p.text, p.target);
                                                });
  using Parts = std::vector<std::pair<std::string, bool>>;
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0], (Parts{{"Q: 2+2?", false}, {" 4", true}}));
  const auto turn = [](const std::string& role, const std::string& content) {
    const bool assistant = role == "assistant";
    return Parts{{"<|im_start|>" + role + "\n", false}, {content, assistant}, {"<|im_end|>", assistant}, {"\n", false}};
  };
  Parts conversation;
  for (const auto& [role, content] : {std::pair{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"},
                                      {"user", "Bye"}, {"assistant", "Bye!"}}) {
    const Parts t = turn(role, content);
    conversation.insert(conversation.end(), t.begin(), t.end());
  }
  EXPECT_EQ(documents[1], conversation);
  EXPECT_EQ(counts.prompt_completions, 1);
  EXPECT_EQ(counts.conversations, 1);
  EXPECT_EQ(counts.invalid_json, 1) << "the robot's role";
  EXPECT_EQ(counts.missing_field, 1) << "a prompt without a completion";
  const CorpusOptions strict;
  testing::expect_error([&] { for_each_document({dir.path("ft.jsonl")}, strict, [](auto, int64_t) {}); },
                        {dir.path("ft.jsonl") + ":3: message role \"robot\" (expected system, user or assistant)"});
}

}  // namespace
}  // namespace trillion
