// Read-only whole-file mappings. See mapped_file.h.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace trillion {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) fail(path, ": cannot open for reading: ", std::strerror(errno));
  struct stat status {};
  if (::fstat(descriptor, &status) != 0) {
    const int error = errno;
    ::close(descriptor);
    fail(path, ": cannot read its size: ", std::strerror(error));
  }
  size_ = static_cast<size_t>(status.st_size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, descriptor, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      ::close(descriptor);
      fail(path, ": cannot map ", size_, " bytes: ", std::strerror(error));
    }
    data_ = static_cast<const char*>(mapping);
  }
  ::close(descriptor);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace trillion
