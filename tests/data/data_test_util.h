// Helpers for the data tests: a generated text corpus, gzip and zstd files of several members /
// frames, and expecting a trillion::Error whose message contains given parts. (Their temporary
// directories are test::ScratchDir, test_support/scratch_dir.h.)
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/shards.h"
#include "io/atomic_file.h"

namespace trillion::testing {

// `count` documents of pseudo-random words (syllables from a fixed list, so BPE has merges to
// learn), with punctuation, newlines, leading spaces and a few non-ASCII characters.
inline std::vector<std::string> generated_documents(int count, uint64_t seed) {
  static const char* const kSyllables[] = {"ka", "to", "ri", "mon", "el", "sa", "qu", "ix", "bo", "ne",
                                           "th", "ar", "ve", "lu", "pe", "dr", "om", "ga", "fi", "zu"};
  static const char* const kExtras[] = {"é", "ß", "→", "日本", "42", "1999", "!", "?", ",", "(x)"};
  const CounterRng rng(seed, "test.corpus");
  uint64_t counter = 0;
  std::vector<std::string> documents;
  for (int d = 0; d < count; ++d) {
    std::string document = d % 5 == 0 ? "  " : "";
    const int words = 8 + static_cast<int>(rng.bits(counter++) % 40);
    for (int w = 0; w < words; ++w) {
      const int syllables = 1 + static_cast<int>(rng.bits(counter++) % 3);
      for (int s = 0; s < syllables; ++s) document += kSyllables[rng.bits(counter++) % 20];
      if (rng.bits(counter++) % 9 == 0) document += kExtras[rng.bits(counter++) % 10];
      document += rng.bits(counter++) % 7 == 0 ? "\n" : " ";
    }
    document += "end.\n";
    documents.push_back(document);
  }
  return documents;
}

inline void write_gzip(const std::string& path, const std::vector<std::string>& members) {
  std::string bytes;
  for (const std::string& member : members) {  // each its own gzip stream, concatenated
    const std::string part = path + ".part";
    gzFile file = gzopen(part.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, member.data(), static_cast<unsigned>(member.size())), static_cast<int>(member.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
    bytes += read_file(part);
    std::filesystem::remove(part);
  }
  write_file_atomic(path, bytes);
}

inline void write_zstd(const std::string& path, const std::vector<std::string>& frames) {
  std::string bytes;
  for (const std::string& frame : frames) {
    std::string out(ZSTD_compressBound(frame.size()), '\0');
    const size_t size = ZSTD_compress(out.data(), out.size(), frame.data(), frame.size(), 3);
    ASSERT_FALSE(ZSTD_isError(size));
    bytes += out.substr(0, size);
  }
  write_file_atomic(path, bytes);
}

// Every token of a split, its shards one after another.
inline std::vector<int32_t> all_tokens(const TokenSplit& split) {
  std::vector<int32_t> tokens;
  for (const TokenShard& shard : split.shards) tokens.insert(tokens.end(), shard.tokens.begin(), shard.tokens.end());
  return tokens;
}

// Runs `body`, expecting a trillion::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& body, const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nmissing: " << part;
    return;
  }
  ADD_FAILURE() << "expected a trillion::Error";
}

}  // namespace trillion::testing
