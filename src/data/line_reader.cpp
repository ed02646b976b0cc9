// Lines of plain, gzip and zstd text files, streamed. See line_reader.h.
#include "data/line_reader.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace trillion {
namespace {

constexpr size_t kBlockBytes = size_t{1} << 20;

FILE* open_for_reading(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) fail(path, ": cannot open for reading: ", std::strerror(errno));
  return file;
}

class PlainSource : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : path_(path), file_(open_for_reading(path)) {}
  ~PlainSource() override { std::fclose(file_); }
  size_t read(char* data, size_t size) override {
    const size_t got = std::fread(data, 1, size, file_);
    if (got == 0 && std::ferror(file_)) fail(path_, ": read error: ", std::strerror(errno));
    return got;
  }

 private:
  std::string path_;
  FILE* file_;
};

class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) fail(path, ": cannot open for reading: ", std::strerror(errno));
    gzbuffer(file_, kBlockBytes);
  }
  ~GzipSource() override { gzclose(file_); }
  size_t read(char* data, size_t size) override {
    const int got = gzread(file_, data, static_cast<unsigned>(size));
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (got < 0 || (code != Z_OK && code != Z_BUF_ERROR)) fail(path_, ": corrupt gzip data: ", message);
    if (got == 0 && code == Z_BUF_ERROR) fail(path_, ": truncated gzip data (the input ends inside a stream)");
    return static_cast<size_t>(got);
  }

 private:
  std::string path_;
  gzFile file_;
};

class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path)
      : path_(path), file_(open_for_reading(path)), stream_(ZSTD_createDStream()), input_(ZSTD_DStreamInSize()) {
    TRILLION_CHECK(stream_ != nullptr, "ZSTD_createDStream failed");
  }
  ~ZstdSource() override {
    ZSTD_freeDStream(stream_);
    std::fclose(file_);
  }
  size_t read(char* data, size_t size) override {
    ZSTD_outBuffer out{data, size, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        const size_t got = std::fread(input_.data(), 1, input_.size(), file_);
        if (got == 0) {
          if (std::ferror(file_)) fail(path_, ": read error: ", std::strerror(errno));
          if (frame_open_) fail(path_, ": truncated zstd data (the last frame does not end)");
          return 0;
        }
        in_ = ZSTD_inBuffer{input_.data(), got, 0};
      }
      const size_t status = ZSTD_decompressStream(stream_, &out, &in_);
      if (ZSTD_isError(status)) fail(path_, ": corrupt zstd data: ", ZSTD_getErrorName(status));
      frame_open_ = status != 0;
    }
    return out.pos;
  }

 private:
  std::string path_;
  FILE* file_;
  ZSTD_DStream* stream_;
  std::vector<char> input_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_open_ = false;
};

}  // namespace

std::unique_ptr<ByteSource> open_byte_source(const std::string& path) {
  if (path.ends_with(".gz")) return std::make_unique<GzipSource>(path);
  if (path.ends_with(".zst")) return std::make_unique<ZstdSource>(path);
  return std::make_unique<PlainSource>(path);
}

std::string strip_compression_suffix(const std::string& path) {
  for (const std::string_view suffix : {".gz", ".zst"}) {
    if (path.ends_with(suffix)) return path.substr(0, path.size() - suffix.size());
  }
  return path;
}

LineReader::LineReader(const std::string& path) : path_(path), source_(open_byte_source(path)) {}

bool LineReader::fill() {
  if (at_end_) return false;
  buffer_.erase(0, begin_);
  begin_ = 0;
  const size_t kept = buffer_.size();
  buffer_.resize(kept + kBlockBytes);
  const size_t got = source_->read(buffer_.data() + kept, kBlockBytes);
  buffer_.resize(kept + got);
  at_end_ = got == 0;
  return !at_end_;
}

bool LineReader::next(std::string_view& line) {
  size_t searched = begin_;  // bytes before this have no '\n'
  for (;;) {
    const size_t newline = buffer_.find('\n', searched);
    if (newline != std::string::npos) {
      line = std::string_view(buffer_).substr(begin_, newline - begin_);
      bytes_read_ += static_cast<int64_t>(newline + 1 - begin_);
      begin_ = newline + 1;
      ++line_number_;
      return true;
    }
    searched = buffer_.size() - begin_;  // fill() moves the unconsumed bytes to the front
    if (!fill()) break;
  }
  if (begin_ == buffer_.size()) return false;
  line = std::string_view(buffer_).substr(begin_);  // the last line, without a '\n'
  bytes_read_ += static_cast<int64_t>(line.size());
  begin_ = buffer_.size();
  ++line_number_;
  return true;
}

}  // namespace trillion
