// Tokenizer: loading, encoding and decoding with a SentencePiece model, and deterministic BPE
// training of one from a sample of sentences (see tokenizer.h for the model's settings).
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer_sample.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

// Hands the sentences to the SentencePiece trainer one by one, in order.
class SentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit SentenceIterator(const std::vector<std::string>& sentences) : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<std::string>& sentences_;
  size_t index_ = 0;
};

}  // namespace

uint64_t tokenizer_file_hash(const std::string& model_path) { return hash_name(read_file(model_path)); }

std::string tokenizer_file_in(const std::string& directory) {
  const std::filesystem::path json = std::filesystem::path(directory) / "tokenizer.json";
  return std::filesystem::exists(json) ? json.string() : (std::filesystem::path(directory) / "tokenizer.model").string();
}

Tokenizer::Tokenizer(const std::string& model_path) {
  const std::string serialized = read_file(model_path);
  hash_ = hash_name(serialized);
  if (model_path.ends_with(".json")) {
    hf_ = std::make_unique<HfTokenizer>(model_path);
    for (const char* token : kHfEndOfTextTokens) {
      if (const std::optional<int32_t> id = hf_->token_id(token)) {
        eos_ = *id;
        break;
      }
    }
    if (eos_ < 0) fail(model_path, ": has no end-of-text token to end documents (expected an added token <|endoftext|>, ",
                       "<｜end▁of▁sentence｜>, <|end_of_text|>, </s> or <eos>)");
    return;
  }
  processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor_->LoadFromSerializedProto(serialized);
  if (!status.ok()) fail(model_path, ": not a SentencePiece model: ", status.ToString());
  if (processor_->eos_id() < 0) fail(model_path, ": tokenizer model has no eos piece (expected eos_id >= 0)");
  eos_ = processor_->eos_id();
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int64_t Tokenizer::vocab_size() const { return hf_ ? hf_->vocab_size() : processor_->GetPieceSize(); }

int32_t Tokenizer::eos_id() const { return eos_; }

std::optional<int32_t> Tokenizer::piece_id(const std::string& piece) const {
  if (hf_) return hf_->token_id(piece);
  const int id = processor_->PieceToId(piece);
  if (processor_->IsUnknown(id)) return std::nullopt;
  return static_cast<int32_t>(id);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (hf_) return hf_->encode(text);
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) fail("tokenizer: cannot encode text: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode_with_offsets(const std::string& text, std::vector<uint32_t>& begins) const {
  if (hf_) return hf_->encode_with_offsets(text, begins);
  const sentencepiece::ImmutableSentencePieceText pieces = processor_->EncodeAsImmutableProto(text);
  std::vector<int32_t> ids;
  begins.clear();
  for (size_t i = 0; i < pieces.pieces_size(); ++i) {
    const auto piece = pieces.pieces(static_cast<int>(i));
    ids.push_back(static_cast<int32_t>(piece.id()));
    begins.push_back(piece.begin());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (hf_) {  // eos decodes to "" as in SentencePiece
    std::vector<int32_t> kept;
    for (const int32_t id : ids) {
      if (id != eos_) kept.push_back(id);
    }
    return hf_->decode(kept);
  }
  const std::vector<int> pieces(ids.begin(), ids.end());
  for (int id : pieces) {
    if (id < 0 || id >= processor_->GetPieceSize())
      fail("tokenizer: cannot decode token id ", id, " (expected 0 <= id < ", processor_->GetPieceSize(), ")");
  }
  std::string text;
  const auto status = processor_->Decode(pieces, &text);
  if (!status.ok()) fail("tokenizer: cannot decode ids: ", status.ToString());
  return text;
}

void train_tokenizer(const std::vector<std::string>& sentences, int64_t vocab_size, const std::string& model_path,
                     const std::vector<std::string>& symbols) {
  std::string user_symbols = "\n";
  for (const std::string& symbol : symbols) user_symbols += "," + symbol;
  if (sentences.empty()) fail(model_path, ": cannot train a tokenizer on no text");
  for (const std::string& sentence : sentences)
    TRILLION_CHECK(static_cast<int64_t>(sentence.size()) <= kMaxTrainingSentenceBytes, "training sentence of ",
                   sentence.size(), " bytes");

  const std::unordered_map<std::string, std::string> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"user_defined_symbols", user_symbols},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxTrainingSentenceBytes)},
      {"minloglevel", "2"},
  };
  SentenceIterator iterator(sentences);
  std::string serialized;
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator, &serialized);
  if (!status.ok())
    fail(model_path, ": SentencePiece training with vocab_size ", vocab_size, " failed: ", status.ToString());
  write_file_atomic(model_path, serialized);
}

}  // namespace trillion
