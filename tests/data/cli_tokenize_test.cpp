// `trillion tokenize` end to end on tiny texts in a temp dir: the data directory it writes opens,
// holds exactly the input documents, is reproducible and reusable with --tokenizer; bad input
// exits non-zero with a clear message.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "test_support/command.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using test::CommandResult;
using test::ScratchDir;

// Runs the trillion binary with `arguments`; the output is its stdout and stderr.
CommandResult run_trillion(const std::string& arguments) {
  return test::run_shell(std::string(TRILLION_BINARY) + " " + arguments + " 2>&1");
}

// Decodes a shard's stream into its documents (split at eos).
std::vector<std::string> decode_documents(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens) {
  std::vector<std::string> documents;
  std::vector<int32_t> current;
  for (int32_t id : tokens) {
    if (id == tokenizer.eos_id()) {
      documents.push_back(tokenizer.decode(current));
      current.clear();
    } else {
      current.push_back(id);
    }
  }
  EXPECT_TRUE(current.empty()) << "stream does not end with eos";
  return documents;
}

TEST(CliTokenize, WritesADataDirectoryHoldingExactlyTheDocuments) {
  ScratchDir dir("cli_tokenize");
  // A fortune file ("%" lines separate documents, blank lines inside one are kept) and a plain
  // text file (blank lines separate paragraphs).
  std::vector<std::string> expected = testing::generated_documents(60, 21);
  std::string fortune_text;
  for (const std::string& document : expected) fortune_text += document + "%\n";
  fortune_text += "A fortune\n\nwith a blank line inside.\n";
  expected.push_back("A fortune\n\nwith a blank line inside.\n");
  write_file_atomic(dir.path("fortunes.txt"), fortune_text);
  write_file_atomic(dir.path("plain.txt"), "\nFirst paragraph,\ntwo lines.\n\n\nSecond paragraph.\n   \nThird.");
  expected.insert(expected.end(), {"First paragraph,\ntwo lines.\n", "Second paragraph.\n", "Third.\n"});

  const std::string inputs = "--input " + dir.path("fortunes.txt") + " " + dir.path("plain.txt");
  const CommandResult first = run_trillion("tokenize " + inputs + " --out " + dir.path("a") + " --vocab-size 400 --val-fraction 0.1 --seed 3");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("64 documents (58 train, 6 val"), std::string::npos) << first.output;

  const DataDir data = open_data_dir(dir.path("a"), 400);
  const Tokenizer tokenizer(data.tokenizer_path);
  std::vector<std::string> train = decode_documents(tokenizer, testing::all_tokens(data.train));
  const std::vector<std::string> val = decode_documents(tokenizer, testing::all_tokens(data.val));
  EXPECT_EQ(train.size(), 58u);
  EXPECT_EQ(val.size(), 6u);
  uint64_t train_bytes = 0, val_bytes = 0;
  for (const std::string& document : train) train_bytes += document.size();
  for (const std::string& document : val) val_bytes += document.size();
  EXPECT_EQ(data.train.text_bytes, train_bytes);
  EXPECT_EQ(data.val.text_bytes, val_bytes);
  std::vector<std::string> all = train;
  all.insert(all.end(), val.begin(), val.end());
  std::sort(all.begin(), all.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(all, expected);

  // Same inputs and seed: identical files. Reusing the tokenizer: same model, same shards.
  ASSERT_EQ(run_trillion("tokenize " + inputs + " --out " + dir.path("b") + " --vocab-size 400 --val-fraction 0.1 --seed 3").status, 0);
  const CommandResult reuse = run_trillion(
      "tokenize " + inputs + " --out " + dir.path("c") + " --tokenizer " + data.tokenizer_path + " --val-fraction 0.1 --seed 3");
  ASSERT_EQ(reuse.status, 0) << reuse.output;
  for (const char* file : {"tokenizer.model", "train.bin", "val.bin"}) {
    EXPECT_EQ(read_file(dir.path(std::string("a/") + file)), read_file(dir.path(std::string("b/") + file))) << file;
    EXPECT_EQ(read_file(dir.path(std::string("a/") + file)), read_file(dir.path(std::string("c/") + file))) << file;
  }
  // Another seed: another split.
  ASSERT_EQ(run_trillion("tokenize " + inputs + " --out " + dir.path("d") + " --vocab-size 400 --val-fraction 0.1 --seed 4").status, 0);
  EXPECT_NE(read_file(dir.path("a/val.bin")), read_file(dir.path("d/val.bin")));
}

// Expects `arguments` to fail with exit status 1 and a message containing every part.
void expect_cli_error(const std::string& arguments, const std::vector<std::string>& parts) {
  const CommandResult result = run_trillion(arguments);
  EXPECT_NE(result.status, 0) << arguments;
  for (const std::string& part : parts) EXPECT_NE(result.output.find(part), std::string::npos) << result.output << "\nmissing: " << part;
}

TEST(CliTokenize, BadInputIsAClearError) {
  ScratchDir dir("cli_tokenize_errors");
  write_file_atomic(dir.path("text.txt"), "one\n%\ntwo\n");
  const std::string input = "tokenize --input " + dir.path("text.txt");
  expect_cli_error("tokenize --input " + dir.path("missing.txt") + " --out " + dir.path("o") + " --vocab-size 300",
                   {"error:", dir.path("missing.txt"), "input file not found"});
  expect_cli_error(input + " --out " + dir.path("o") + " --vocab-size 300 --tokenizer " + dir.path("text.txt"),
                   {"error:", "exactly one of --vocab-size N", "--tokenizer MODEL"});
  expect_cli_error(input + " --out " + dir.path("o"), {"error:", "exactly one of --vocab-size N"});
  expect_cli_error(input + " --out " + dir.path("text.txt/sub") + " --vocab-size 300",
                   {"error:", dir.path("text.txt/sub"), "cannot create output directory"});
  expect_cli_error(input + " --out " + dir.path("o") + " --tokenizer " + dir.path("text.txt"),
                   {"error:", dir.path("text.txt"), "not a SentencePiece model"});
  expect_cli_error(input + " --out " + dir.path("o") + " --vocab-size 300 --val-fraction 1.5",
                   {"error:", "--val-fraction 1.5"});
}

}  // namespace
}  // namespace trillion
