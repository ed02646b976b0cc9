// Tokenizer: SentencePiece BPE (Debian's libsentencepiece) trained on the corpus or reused, or a
// Hugging Face tokenizer.json (data/hf_tokenizer.h: byte-level BPE, as Qwen3 and DeepSeek ship it).
// Its hash (FNV-1a 64 of the file) is recorded in token shards and checkpoints; a mismatch anywhere
// is an error. A data directory or checkpoint holds tokenizer.model or tokenizer.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trillion {

class HfTokenizer;

// Hugging Face tokenizers do not say which token ends a document: the first of these added
// tokens that the tokenizer has.
inline const char* const kHfEndOfTextTokens[] = {"<|endoftext|>", "<｜end▁of▁sentence｜>", "<|end_of_text|>", "</s>",
                                                  "<eos>"};

// DIR/tokenizer.json when it exists, else DIR/tokenizer.model.
std::string tokenizer_file_in(const std::string& directory);

class Tokenizer {
 public:
  // Loads a SentencePiece model file, or a tokenizer.json (a name ending in ".json"); throws
  // trillion::Error naming the path if it is not one.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  int64_t vocab_size() const;
  uint64_t hash() const { return hash_; }
  int32_t eos_id() const;  // document separator appended after every document
  bool has_piece(const std::string& piece) const { return piece_id(piece).has_value(); }
  std::optional<int32_t> piece_id(const std::string& piece) const;  // a piece of its own's id; none if unknown
  std::vector<int32_t> encode(const std::string& text) const;  // adds no eos; the caller appends it
  // The same ids, and the byte offset in `text` where each token's piece begins.
  std::vector<int32_t> encode_with_offsets(const std::string& text, std::vector<uint32_t>& begins) const;
  // Throws trillion::Error on an id outside [0, vocab_size); eos decodes to "".
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;  // one of the two
  std::unique_ptr<HfTokenizer> hf_;
  int32_t eos_ = -1;
  uint64_t hash_ = 0;
};

// Trains a BPE model of `vocab_size` pieces on `sentences` (each at most kMaxTrainingSentenceBytes:
// data/tokenizer_sample.h; deterministically: one thread, the sentences in the given order, no
// sampling of its own) and writes it to `model_path` atomically.
// The model: byte fallback on, identity normalization (text round-trips exactly), "\n" is a
// piece of its own, ids unk = 0 and eos = 1, no bos/pad. Throws trillion::Error when SentencePiece
// refuses (e.g. a vocab_size too large for the text or too small for the 256 byte pieces).
// `symbols`: more user-defined pieces, each kept whole (ChatML's markers for conversations).
void train_tokenizer(const std::vector<std::string>& sentences, int64_t vocab_size, const std::string& model_path,
                     const std::vector<std::string>& symbols = {});

// Hash of a tokenizer model file as Tokenizer::hash() computes it.
uint64_t tokenizer_file_hash(const std::string& model_path);

}  // namespace trillion
