// LineReader: the lines of one text file, streamed in fixed-size blocks, decompressed on the fly
// when the name ends in ".gz" (zlib; concatenated members too) or ".zst" (zstd; several frames
// too). A line is the bytes between two '\n' (a trailing "\r" is kept: lines are verbatim); the
// file's last line needs no '\n'. Memory: one block plus the longest line. Read errors and corrupt
// compressed data throw trillion::Error naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace trillion {

// A stream of (decompressed) bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `size` bytes into `data`; 0 only at the end of the stream.
  virtual size_t read(char* data, size_t size) = 0;
};

// The source for `path`: plain, gzip or zstd by its name's ending.
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

// The name without a ".gz" / ".zst" ending ("a.jsonl.gz" → "a.jsonl").
std::string strip_compression_suffix(const std::string& path);

class LineReader {
 public:
  explicit LineReader(const std::string& path);
  // The next line (without its '\n'), valid until the next call; false at the end.
  bool next(std::string_view& line);
  int64_t line_number() const { return line_number_; }  // of the line next() returned, from 1
  int64_t bytes_read() const { return bytes_read_; }    // decompressed bytes consumed so far
  const std::string& path() const { return path_; }

 private:
  bool fill();  // reads one more block after the unconsumed bytes; false at the end

  std::string path_;
  std::unique_ptr<ByteSource> source_;
  std::string buffer_;    // unconsumed bytes [begin_, buffer_.size())
  size_t begin_ = 0;
  bool at_end_ = false;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace trillion
