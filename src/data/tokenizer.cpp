// Tokenizer: loading, encoding and decoding with a SentencePiece model, and deterministic BPE
// training of one from in-memory documents (see tokenizer.h for the model's settings).
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"

namespace trillion {
namespace {

// Documents longer than this many bytes are skipped by the trainer (still encoded later).
constexpr int64_t kMaxTrainingDocumentBytes = 1 << 18;
// At most this many bytes of documents go to the trainer; above it every k-th document is taken.
constexpr int64_t kMaxTrainingBytes = int64_t{256} << 20;

// Hands the documents to the SentencePiece trainer one by one, in order.
class DocumentIterator : public sentencepiece::SentenceIterator {
 public:
  DocumentIterator(const std::vector<std::string>& documents, int64_t stride)
      : documents_(documents), stride_(stride) {}
  bool done() const override { return index_ >= documents_.size(); }
  void Next() override { index_ += static_cast<size_t>(stride_); }
  const std::string& value() const override { return documents_[index_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<std::string>& documents_;
  int64_t stride_;
  size_t index_ = 0;
};

}  // namespace

uint64_t tokenizer_file_hash(const std::string& model_path) { return hash_name(read_file(model_path)); }

Tokenizer::Tokenizer(const std::string& model_path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const std::string serialized = read_file(model_path);
  const auto status = processor_->LoadFromSerializedProto(serialized);
  if (!status.ok()) fail(model_path, ": not a SentencePiece model: ", status.ToString());
  if (processor_->eos_id() < 0) fail(model_path, ": tokenizer model has no eos piece (expected eos_id >= 0)");
  hash_ = hash_name(serialized);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int64_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }

int32_t Tokenizer::eos_id() const { return processor_->eos_id(); }

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) fail("tokenizer: cannot encode text: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
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

void train_tokenizer(const std::vector<std::string>& documents, int64_t vocab_size, const std::string& model_path) {
  if (documents.empty()) fail(model_path, ": cannot train a tokenizer on no documents");
  int64_t total_bytes = 0;
  for (const std::string& document : documents) total_bytes += static_cast<int64_t>(document.size());
  const int64_t stride = total_bytes > kMaxTrainingBytes ? (total_bytes + kMaxTrainingBytes - 1) / kMaxTrainingBytes : 1;

  const std::unordered_map<std::string, std::string> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"user_defined_symbols", "\n"},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxTrainingDocumentBytes)},
      {"minloglevel", "2"},
  };
  DocumentIterator iterator(documents, stride);
  std::string serialized;
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator, &serialized);
  if (!status.ok())
    fail(model_path, ": SentencePiece training with vocab_size ", vocab_size, " failed: ", status.ToString());
  write_file_atomic(model_path, serialized);
}

}  // namespace trillion
