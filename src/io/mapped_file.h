// MappedFile: a whole file mapped read-only into memory (mmap, MAP_PRIVATE), unmapped on
// destruction. Its pages are the page cache's, read on first touch and given back under memory
// pressure, so readers of large files (token shards) neither copy them nor hold them resident.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trillion {

class MappedFile {
 public:
  // Throws trillion::Error naming the path if it cannot be opened, sized or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view bytes() const { return {data_, size_}; }  // empty for an empty file
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trillion
