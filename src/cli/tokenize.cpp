// `trillion tokenize`: text files → DIR/tokenizer.model, DIR/train.bin, DIR/val.bin.
//
// Documents: a file that has a line consisting of "%" alone is a fortune file, and its "%" lines
// separate documents; any other file is split into paragraphs at empty lines. A document is its
// lines verbatim, each ending in "\n"; documents with nothing but whitespace are dropped.
// Split: round(val_fraction · documents) documents (at least one in each split when there are two
// or more documents and the fraction is positive) go to val, those with the smallest
// CounterRng(seed, "data.val_split").bits(index); the rest, in input order, to train.
// The tokenizer is trained on the train documents only (or copied from --tokenizer); each split
// is encoded document by document with the tokenizer's eos id after every document.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int64_t vocab_size = 0;
  std::string tokenizer_path;
  double val_fraction = 0.05;
  uint64_t seed = 1;
};

bool is_whitespace_only(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
}

// Appends the documents of one file (see the rule at the top of this file) to `documents`.
void read_documents(const std::string& path, std::vector<std::string>& documents, int64_t& bytes) {
  const std::string text = read_file(path);
  bytes += static_cast<int64_t>(text.size());
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  const auto is_percent = [](const std::string& line) { return line == "%" || line == "%\r"; };
  const bool fortune_file = std::any_of(lines.begin(), lines.end(), is_percent);
  std::string document;
  const auto finish_document = [&] {
    if (!is_whitespace_only(document)) documents.push_back(document);
    document.clear();
  };
  for (const std::string& line : lines) {
    if (fortune_file ? is_percent(line) : is_whitespace_only(line)) {
      finish_document();
    } else {
      document += line;
      document += '\n';
    }
  }
  finish_document();
}

// is_val[d] for each document d (rule at the top of this file).
std::vector<bool> assign_val_documents(int64_t documents, double val_fraction, uint64_t seed) {
  int64_t val_count = std::llround(val_fraction * static_cast<double>(documents));
  if (val_fraction > 0 && documents >= 2) val_count = std::clamp<int64_t>(val_count, 1, documents - 1);
  const CounterRng rng(seed, "data.val_split");
  std::vector<std::pair<uint64_t, int64_t>> keys(static_cast<size_t>(documents));
  for (int64_t d = 0; d < documents; ++d) keys[static_cast<size_t>(d)] = {rng.bits(static_cast<uint64_t>(d)), d};
  std::sort(keys.begin(), keys.end());
  std::vector<bool> is_val(static_cast<size_t>(documents), false);
  for (int64_t k = 0; k < val_count; ++k) is_val[static_cast<size_t>(keys[static_cast<size_t>(k)].second)] = true;
  return is_val;
}

struct EncodedSplit {
  std::vector<int32_t> tokens;
  uint64_t text_bytes = 0;
};

EncodedSplit encode_documents(const Tokenizer& tokenizer, const std::vector<std::string>& documents) {
  EncodedSplit split;
  for (const std::string& document : documents) {
    const std::vector<int32_t> ids = tokenizer.encode(document);
    split.tokens.insert(split.tokens.end(), ids.begin(), ids.end());
    split.tokens.push_back(tokenizer.eos_id());
    split.text_bytes += document.size();
  }
  return split;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_tokenize(const TokenizeOptions& options) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  if ((options.vocab_size > 0) == !options.tokenizer_path.empty())
    fail("tokenize: give exactly one of --vocab-size N (train a tokenizer) or --tokenizer MODEL (reuse one)");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0))
    fail("tokenize: --val-fraction ", options.val_fraction, " out of range (expected 0 <= F < 1)");
  for (const std::string& input : options.inputs) {
    if (!fs::is_regular_file(input)) fail(input, ": input file not found (--input)");
  }
  std::error_code error;
  fs::create_directories(options.out_dir, error);
  if (error || !fs::is_directory(options.out_dir))
    fail(options.out_dir, ": cannot create output directory (--out): ", error ? error.message() : "not a directory");
  if (::access(options.out_dir.c_str(), W_OK) != 0) fail(options.out_dir, ": output directory is not writable (--out)");

  std::vector<std::string> documents;
  int64_t input_bytes = 0;
  for (const std::string& input : options.inputs) read_documents(input, documents, input_bytes);
  if (documents.empty()) fail("tokenize: the input files hold no documents (only whitespace)");
  const std::vector<bool> is_val = assign_val_documents(static_cast<int64_t>(documents.size()), options.val_fraction, options.seed);
  std::vector<std::string> train_documents, val_documents;
  for (size_t d = 0; d < documents.size(); ++d) (is_val[d] ? val_documents : train_documents).push_back(std::move(documents[d]));
  const double read_s = seconds_since(start);

  const std::string model_path = (fs::path(options.out_dir) / "tokenizer.model").string();
  if (options.vocab_size > 0) {
    train_tokenizer(train_documents, options.vocab_size, model_path);
  } else {
    const Tokenizer source(options.tokenizer_path);
    write_file_atomic(model_path, read_file(options.tokenizer_path));
    if (tokenizer_file_hash(model_path) != source.hash())
      fail(model_path, ": copy of ", options.tokenizer_path, " does not hash the same (expected ", source.hash(), ")");
  }
  const Tokenizer tokenizer(model_path);
  const double tokenizer_s = seconds_since(start) - read_s;

  const EncodedSplit train = encode_documents(tokenizer, train_documents);
  const EncodedSplit val = encode_documents(tokenizer, val_documents);
  const auto vocab = static_cast<uint32_t>(tokenizer.vocab_size());
  write_token_shard((fs::path(options.out_dir) / "train.bin").string(), train.tokens, vocab, tokenizer.hash(), train.text_bytes);
  write_token_shard((fs::path(options.out_dir) / "val.bin").string(), val.tokens, vocab, tokenizer.hash(), val.text_bytes);
  const double encode_s = seconds_since(start) - read_s - tokenizer_s;

  std::printf("input: %zu files, %lld bytes, %zu documents (%zu train, %zu val; val fraction %g, seed %llu)\n",
              options.inputs.size(), static_cast<long long>(input_bytes), train_documents.size() + val_documents.size(),
              train_documents.size(), val_documents.size(), options.val_fraction,
              static_cast<unsigned long long>(options.seed));
  std::printf("tokenizer: %s %s, vocab %u, eos %d, hash 0x%016llx\n", options.vocab_size > 0 ? "trained" : "copied",
              model_path.c_str(), vocab, tokenizer.eos_id(), static_cast<unsigned long long>(tokenizer.hash()));
  for (const auto& [name, split] : {std::pair{"train.bin", &train}, std::pair{"val.bin", &val}}) {
    std::printf("%s: %zu tokens from %llu text bytes (%.2f bytes/token)\n", name, split->tokens.size(),
                static_cast<unsigned long long>(split->text_bytes),
                split->tokens.empty() ? 0.0 : static_cast<double>(split->text_bytes) / static_cast<double>(split->tokens.size()));
  }
  std::printf("time: read %.2fs, tokenizer %.2fs, encode+write %.2fs, total %.2fs\n", read_s, tokenizer_s, encode_s,
              seconds_since(start));
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Split text files into documents, train or reuse a tokenizer, write token shards");
  cmd->add_option("--input", options->inputs, "Text files (fortune files split at \"%\" lines, others at empty lines)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--out", options->out_dir, "Output directory: tokenizer.model, train.bin, val.bin")->required();
  cmd->add_option("--vocab-size", options->vocab_size, "Train a BPE tokenizer of this many pieces on the train split");
  cmd->add_option("--tokenizer", options->tokenizer_path, "Reuse this SentencePiece model (copied to the output)");
  cmd->add_option("--val-fraction", options->val_fraction, "Fraction of documents held out for val.bin")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the train/val split")->capture_default_str();
  cmd->callback([options] { run_tokenize(*options); });
}

}  // namespace trillion
