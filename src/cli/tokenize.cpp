// `trillion tokenize`: a corpus (data/corpus.h: text, fortune and JSONL files, plain or
// compressed, directories, globs) → DIR/tokenizer.model and the train and val splits (data/shards.h:
// NAME.bin, or shards of at most --shard-mb and an index).
//
// Two streaming passes over the corpus, never holding its text whole:
//   1. count the documents (validating them) and, when training a tokenizer, draw its sample
//      (data/tokenizer_sample.h: bounded sentences, seeded, up to --tokenizer-sample-mb);
//   2. encode the documents in batches on every thread, in order, with the tokenizer's eos id after
//      every document, into the train or val split, holding at most one shard of each in memory.
// Split: round(val_fraction · documents) documents (at least one in each split when there are two
// or more documents and the fraction is positive) go to val, those with the smallest
// CounterRng(seed, "data.val_split").bits(index); the rest, in input order, to train. The
// tokenizer is trained on the train documents' sample only (or copied from --tokenizer); with
// conversations in the corpus (or --chat-markers), ChatML's markers are pieces of their own (a
// reused tokenizer must have them). Fine-tuning documents (prompt/completion, conversations: data/corpus.h) store loss
// masks in their shards (data/shards.h). A progress line (bytes/s, ETA) goes to stderr every few
// seconds of a long pass.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "data/tokenizer_sample.h"
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
  int64_t sample_mb = 64;
  int64_t shard_mb = 256;
  bool chat_markers = false;  // a trained tokenizer gets ChatML's markers even without conversations
  CorpusOptions corpus;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "PHASE: X MB of Y MB, R MB/s, ETA T s" on stderr, at most every few seconds (total 0: unknown).
class Progress {
 public:
  Progress(const char* phase, int64_t total_bytes) : phase_(phase), total_(total_bytes) {}
  void update(int64_t bytes) {
    const double elapsed = seconds_since(start_);
    if (elapsed < next_report_) return;
    next_report_ = elapsed + kEverySeconds;
    const double rate = static_cast<double>(bytes) / std::max(elapsed, 1e-9);
    if (total_ > 0) {
      std::fprintf(stderr, "tokenize: %s %.1f of %.1f MB, %.1f MB/s, ETA %.0f s\n", phase_, bytes / 1e6, total_ / 1e6,
                   rate / 1e6, static_cast<double>(total_ - bytes) / std::max(rate, 1.0));
    } else {
      std::fprintf(stderr, "tokenize: %s %.1f MB, %.1f MB/s\n", phase_, bytes / 1e6, rate / 1e6);
    }
  }
  double seconds() const { return seconds_since(start_); }

 private:
  static constexpr double kEverySeconds = 5.0;
  const char* phase_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double next_report_ = kEverySeconds;
};

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

// Encodes documents in batches of about kBatchBytes on every thread; hands each document's tokens
// and an eos to its split's writer, in corpus order (the same files for any thread count). A
// document of several parts is encoded whole (the tokens are those of its text), and a token whose
// piece begins in a part that is not a target carries kNotTargetBit; the eos is a target when the
// document's last part is.
class BatchEncoder {
 public:
  BatchEncoder(const Tokenizer& tokenizer, const std::vector<bool>& is_val, TokenSplitWriter& train,
               TokenSplitWriter& val)
      : tokenizer_(tokenizer), is_val_(is_val), train_(train), val_(val) {}
  void add(std::span<const DocumentPart> parts) {
    Document& document = batch_.emplace_back();
    for (const DocumentPart& part : parts) {
      document.part_begin.push_back(static_cast<uint32_t>(document.text.size()));
      document.part_target.push_back(part.target);
      document.text += part.text;
    }
    batch_bytes_ += static_cast<int64_t>(document.text.size());
    if (batch_bytes_ >= kBatchBytes) flush();
  }
  void flush() {
    std::vector<std::vector<int32_t>> ids(batch_.size());
    parallel_for_dynamic(static_cast<int64_t>(batch_.size()), [&](int64_t d) {
      const Document& document = batch_[d];
      if (document.part_target.size() == 1 && document.part_target[0]) {
        ids[d] = tokenizer_.encode(document.text);
      } else {
        std::vector<uint32_t> begins;
        ids[d] = tokenizer_.encode_with_offsets(document.text, begins);
        for (size_t t = 0; t < ids[d].size(); ++t) {
          const size_t part = static_cast<size_t>(
              std::upper_bound(document.part_begin.begin(), document.part_begin.end(), begins[t]) -
              document.part_begin.begin() - 1);
          if (!document.part_target[part]) ids[d][t] = static_cast<int32_t>(ids[d][t] | kNotTargetBit);
        }
      }
      const bool eos_target = document.part_target.empty() || document.part_target.back();
      ids[d].push_back(eos_target ? tokenizer_.eos_id() : static_cast<int32_t>(tokenizer_.eos_id() | kNotTargetBit));
    });
    for (size_t d = 0; d < batch_.size(); ++d, ++next_document_) {
      TRILLION_CHECK(next_document_ < static_cast<int64_t>(is_val_.size()), "more documents than counted");
      (is_val_[next_document_] ? val_ : train_).add_document(ids[d], static_cast<int64_t>(batch_[d].text.size()));
    }
    batch_.clear();
    batch_bytes_ = 0;
  }

 private:
  struct Document {
    std::string text;                  // the parts joined
    std::vector<uint32_t> part_begin;  // [parts] byte offset of each part in text
    std::vector<bool> part_target;     // [parts]
  };
  static constexpr int64_t kBatchBytes = 4 << 20;
  const Tokenizer& tokenizer_;
  const std::vector<bool>& is_val_;
  TokenSplitWriter &train_, &val_;
  std::vector<Document> batch_;
  int64_t batch_bytes_ = 0;
  int64_t next_document_ = 0;
};

// The text of a document's parts, joined (what the tokenizer's sample sees).
std::string joined_text(std::span<const DocumentPart> parts) {
  std::string text;
  for (const DocumentPart& part : parts) text += part.text;
  return text;
}

std::string describe_skipped(const CorpusCounts& counts) {
  if (counts.skipped() == 0) return "";
  return ", skipped " + std::to_string(counts.invalid_utf8) + " with invalid UTF-8, " +
         std::to_string(counts.invalid_json) + " JSONL lines not JSON objects, " + std::to_string(counts.missing_field) +
         " without the text field";
}

void run_tokenize(const TokenizeOptions& options) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  if ((options.vocab_size > 0) == !options.tokenizer_path.empty())
    fail("tokenize: give exactly one of --vocab-size N (train a tokenizer) or --tokenizer MODEL (reuse one)");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0))
    fail("tokenize: --val-fraction ", options.val_fraction, " out of range (expected 0 <= F < 1)");
  if (options.sample_mb <= 0) fail("tokenize: --tokenizer-sample-mb ", options.sample_mb, " must be positive");
  if (options.shard_mb <= 0) fail("tokenize: --shard-mb ", options.shard_mb, " must be positive");
  const std::vector<std::string> files = expand_inputs(options.inputs);
  std::error_code error;
  fs::create_directories(options.out_dir, error);
  if (error || !fs::is_directory(options.out_dir))
    fail(options.out_dir, ": cannot create output directory (--out): ", error ? error.message() : "not a directory");
  if (::access(options.out_dir.c_str(), W_OK) != 0) fail(options.out_dir, ": output directory is not writable (--out)");

  // Pass 1: count and validate; the tokenizer's sample.
  std::optional<TokenizerSample> sample;
  if (options.vocab_size > 0) sample.emplace(options.sample_mb << 20, options.seed);
  Progress reading("reading", 0);
  int64_t index = 0;
  const CorpusCounts counts = for_each_document(files, options.corpus, [&](std::span<const DocumentPart> parts,
                                                                          int64_t bytes) {
    if (sample) sample->add_document(parts.size() == 1 ? std::string(parts[0].text) : joined_text(parts), index);
    ++index;
    reading.update(bytes);
  });
  if (counts.documents == 0) {
    fail("tokenize: the inputs hold no documents (", counts.files, " files, ", counts.bytes, " bytes",
         describe_skipped(counts), ")");
  }
  const std::vector<bool> is_val = assign_val_documents(counts.documents, options.val_fraction, options.seed);
  const double read_s = reading.seconds();

  // The output's tokenizer file keeps the kind of the one reused (tokenizer.json or .model).
  const bool hf = options.tokenizer_path.ends_with(".json");
  const std::string model_path = (fs::path(options.out_dir) / (hf ? "tokenizer.json" : "tokenizer.model")).string();
  // An earlier run's tokenizer of the other kind would shadow this one.
  remove_file_if_present((fs::path(options.out_dir) / (hf ? "tokenizer.model" : "tokenizer.json")).string());
  std::vector<std::string> chat_symbols;  // conversations need ChatML's markers as pieces
  if (counts.conversations > 0 || options.chat_markers) chat_symbols = {kChatStart, kChatEnd};
  int64_t sample_sentences = 0, sample_bytes = 0;
  if (sample) {
    const std::vector<std::string> sentences = sample->take([&](int64_t d) { return is_val[d]; });
    sample_sentences = static_cast<int64_t>(sentences.size());
    for (const std::string& sentence : sentences) sample_bytes += static_cast<int64_t>(sentence.size());
    train_tokenizer(sentences, options.vocab_size, model_path, chat_symbols);
  } else {
    const Tokenizer source(options.tokenizer_path);
    write_file_atomic(model_path, read_file(options.tokenizer_path));
    if (tokenizer_file_hash(model_path) != source.hash())
      fail(model_path, ": copy of ", options.tokenizer_path, " does not hash the same (expected ", source.hash(), ")");
  }
  const Tokenizer tokenizer(model_path);
  for (const std::string& symbol : chat_symbols) {
    if (!tokenizer.has_piece(symbol))
      fail(options.tokenizer_path, ": the tokenizer has no piece ", symbol, ", which the conversations' ChatML needs ",
           "(train one on this data with --vocab-size N)");
  }
  const double tokenizer_s = seconds_since(start) - read_s;

  // Pass 2: encode.
  const auto vocab = static_cast<uint32_t>(tokenizer.vocab_size());
  const int64_t shard_tokens = (options.shard_mb << 20) / static_cast<int64_t>(sizeof(int32_t));
  TokenSplitWriter train(options.out_dir, "train", vocab, tokenizer.hash(), shard_tokens);
  TokenSplitWriter val(options.out_dir, "val", vocab, tokenizer.hash(), shard_tokens);
  BatchEncoder encoder(tokenizer, is_val, train, val);
  Progress encoding("encoding", counts.bytes);
  const CorpusCounts again = for_each_document(files, options.corpus, [&](std::span<const DocumentPart> parts,
                                                                         int64_t bytes) {
    encoder.add(parts);
    encoding.update(bytes);
  });
  encoder.flush();
  if (again.documents != counts.documents || again.bytes != counts.bytes)
    fail("tokenize: the inputs changed while being read (", counts.documents, " documents, then ", again.documents, ")");
  train.finish();
  val.finish();
  const double encode_s = encoding.seconds();

  std::printf("input: %lld files, %lld bytes, %lld documents (%lld train, %lld val; val fraction %g, seed %llu)%s\n",
              static_cast<long long>(counts.files), static_cast<long long>(counts.bytes),
              static_cast<long long>(counts.documents), static_cast<long long>(train.documents()),
              static_cast<long long>(val.documents()), options.val_fraction, static_cast<unsigned long long>(options.seed),
              describe_skipped(counts).c_str());
  if (counts.prompt_completions + counts.conversations > 0) {
    std::printf("fine-tuning: %lld prompt/completion documents, %lld conversations (ChatML); loss targets: %lld of "
                "%lld train tokens, %lld of %lld val tokens\n",
                static_cast<long long>(counts.prompt_completions), static_cast<long long>(counts.conversations),
                static_cast<long long>(train.targets()), static_cast<long long>(train.tokens()),
                static_cast<long long>(val.targets()), static_cast<long long>(val.tokens()));
  }
  if (sample) {
    std::printf("tokenizer sample: %lld of %lld sentences, %lld of %lld bytes (budget %lld MB)\n",
                static_cast<long long>(sample_sentences), static_cast<long long>(sample->sentences_seen()),
                static_cast<long long>(sample_bytes), static_cast<long long>(sample->bytes_seen()),
                static_cast<long long>(options.sample_mb));
  }
  std::printf("tokenizer: %s %s, vocab %u, eos %d, hash 0x%016llx\n", options.vocab_size > 0 ? "trained" : "copied",
              model_path.c_str(), vocab, tokenizer.eos_id(), static_cast<unsigned long long>(tokenizer.hash()));
  for (const auto& [name, split] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
    std::printf("%s: %lld tokens from %llu text bytes (%.2f bytes/token) in %s\n", name,
                static_cast<long long>(split->tokens()), static_cast<unsigned long long>(split->text_bytes()),
                split->tokens() == 0 ? 0.0 : static_cast<double>(split->text_bytes()) / static_cast<double>(split->tokens()),
                split->shards() == 0 ? (std::string(name) + ".bin").c_str()
                                     : (std::to_string(split->shards()) + " shards + " + name + ".index.json").c_str());
  }
  std::printf("time: read %.2fs, tokenizer %.2fs, encode+write %.2fs (%.1f MB/s on %d threads), total %.2fs\n", read_s,
              tokenizer_s, encode_s, counts.bytes / 1e6 / std::max(encode_s, 1e-9), num_threads(), seconds_since(start));
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Split text files into documents, train or reuse a tokenizer, write token shards");
  cmd->add_option("--input", options->inputs,
                  "Files, directories or glob patterns: text (documents split at empty lines; fortune files at \"%\" "
                  "lines), JSONL (.jsonl, .ndjson); any of them .gz or .zst")
      ->required()
      ->expected(1, -1);
  cmd->add_flag("--doc-per-line", options->corpus.doc_per_line, "Text files hold one document per line");
  cmd->add_option("--text-field", options->corpus.text_field, "The JSONL field holding a document's text")
      ->capture_default_str();
  cmd->add_flag("--skip-bad", options->corpus.skip_bad,
                "Skip (and count) documents with invalid UTF-8 and bad JSONL lines instead of stopping");
  cmd->add_option("--tokenizer-sample-mb", options->sample_mb,
                  "Train the tokenizer on a seeded sample of at most this many MB of sentences")
      ->capture_default_str();
  cmd->add_option("--out", options->out_dir, "Output directory: tokenizer.model and the train and val splits (data/shards.h)")
      ->required();
  cmd->add_option("--vocab-size", options->vocab_size, "Train a BPE tokenizer of this many pieces on the train split");
  cmd->add_option("--tokenizer", options->tokenizer_path, "Reuse this SentencePiece model (copied to the output)");
  cmd->add_flag("--chat-markers", options->chat_markers,
                "The trained tokenizer holds ChatML's <|im_start|> and <|im_end|> as pieces even without "
                "conversations in the corpus, so a model pretrained on it can be fine-tuned on conversations")
      ->needs("--vocab-size");
  cmd->add_option("--val-fraction", options->val_fraction, "Fraction of documents held out for val.bin")
      ->capture_default_str();
  cmd->add_option("--shard-mb", options->shard_mb,
                  "Largest token shard in MB (the split's shards + an index when it holds more)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the train/val split and of the tokenizer's sample")
      ->capture_default_str();
  cmd->callback([options] { run_tokenize(*options); });
}

}  // namespace trillion
