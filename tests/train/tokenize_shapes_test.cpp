// Corpora in the shapes users bring, end to end: documents of 30–60 KB (longer than the
// tokenizer's sentence limit and than any read block of a compressed file) stored one per line
// with no blank lines, the same documents as JSONL, and as a directory of plain, .gz and .zst
// files; and split into shards of 1 MB behind an index. Each tokenizes (its data directory holds
// exactly the documents) and trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/cli_fixture.h"

namespace trillion::train_test {
namespace {

// Documents of 30 KB and more, without newlines.
std::vector<std::string> long_documents(int count) {
  std::vector<std::string> words = trillion::testing::generated_documents(400, 31);
  std::vector<std::string> documents;
  size_t next = 0;
  for (int d = 0; d < count; ++d) {
    std::string document;
    const size_t length = 30000 + static_cast<size_t>(d) * 30000 / count;
    while (document.size() < length) {
      std::string piece = words[next++ % words.size()];
      std::replace(piece.begin(), piece.end(), '\n', ' ');
      document += piece;
    }
    documents.push_back(document);
  }
  return documents;
}

// The documents of a data directory's two splits, sorted, decoded with its tokenizer.
std::vector<std::string> decoded_documents(const fs::path& data_dir) {
  const DataDir data = open_data_dir(data_dir.string(), 0);
  const Tokenizer tokenizer(data.tokenizer_path);
  std::vector<std::string> documents;
  for (const TokenSplit* split : {&data.train, &data.val}) {
    std::vector<int32_t> current;
    for (const int32_t id : trillion::testing::all_tokens(*split)) {
      if (id != tokenizer.eos_id()) {
        current.push_back(id);
        continue;
      }
      documents.push_back(tokenizer.decode(current));
      current.clear();
    }
  }
  std::sort(documents.begin(), documents.end());
  return documents;
}

TEST(TokenizeShapes, LongDocumentsPerLineAsJsonlAndInADirectoryTokenizeAndTrain) {
  const fs::path root = test_data().root / "shapes";
  fs::remove_all(root);
  fs::create_directories(root / "dir" / "more");
  const std::vector<std::string> documents = long_documents(20);
  std::string lines, jsonl, part[3];
  for (size_t d = 0; d < documents.size(); ++d) {
    lines += documents[d] + "\n";
    jsonl += nlohmann::json{{"id", d}, {"text", documents[d]}}.dump() + "\n";
    part[d * 3 / documents.size()] += documents[d] + "\n";
  }
  write_text(root / "corpus.txt", lines);
  write_text(root / "corpus.jsonl", jsonl);
  write_text(root / "dir" / "a.txt", part[0]);
  trillion::testing::write_gzip((root / "dir" / "b.txt.gz").string(), {part[1].substr(0, 5000), part[1].substr(5000)});
  trillion::testing::write_zstd((root / "dir" / "more" / "c.txt.zst").string(), {part[2]});

  std::vector<std::string> with_newlines = documents;
  for (std::string& document : with_newlines) document += "\n";
  std::sort(with_newlines.begin(), with_newlines.end());
  std::vector<std::string> verbatim = documents;
  std::sort(verbatim.begin(), verbatim.end());
  const struct {
    std::string name, input;
    const std::vector<std::string>* expected;
  } shapes[] = {{"lines", (root / "corpus.txt").string() + " --doc-per-line", &with_newlines},
                {"jsonl", (root / "corpus.jsonl").string(), &verbatim},
                {"directory", (root / "dir").string() + " --doc-per-line", &with_newlines},
                {"shards", (root / "corpus.txt").string() + " --doc-per-line --shard-mb 1", &with_newlines}};
  for (const auto& shape : shapes) {
    const fs::path data = root / ("data_" + shape.name);
    const CommandResult tokenized = run_cli("tokenize --input " + shape.input + " --out " + data.string() +
                                            " --vocab-size 320 --val-fraction 0.2");
    ASSERT_EQ(tokenized.status, 0) << shape.name << ": " << tokenized.output;
    EXPECT_NE(tokenized.output.find("20 documents (16 train, 4 val"), std::string::npos) << tokenized.output;
    EXPECT_EQ(fs::exists(data / "train.index.json"), shape.name == "shards") << tokenized.output;
    EXPECT_EQ(decoded_documents(data), *shape.expected) << shape.name;

    const fs::path config = root / "tiny_320.json";
    write_config(config, read_token_split(data.string(), "train").vocab_size);
    const CommandResult trained = run_cli("train --config " + config.string() + " --data " + data.string() +
                                          " --out " + (root / ("run_" + shape.name)).string() +
                                          " --batch 2 --seq-len 32 --steps 3 --log-every 1" + kSmallMfuGemm);
    ASSERT_EQ(trained.status, 0) << shape.name << ": " << trained.output;
    EXPECT_EQ(read_metrics(root / ("run_" + shape.name)).size(), 3u) << shape.name;
  }
  // The whole file as one document (no --doc-per-line: no blank line splits it) trains a tokenizer too.
  const CommandResult whole = run_cli("tokenize --input " + (root / "corpus.txt").string() + " --out " +
                                      (root / "data_whole").string() + " --vocab-size 320");
  ASSERT_EQ(whole.status, 0) << whole.output;
  EXPECT_NE(whole.output.find("1 documents"), std::string::npos) << whole.output;
}

}  // namespace
}  // namespace trillion::train_test
