// safetensors file reader and writer (format and validation rules in safetensors.h).
// Checkpoint directories (single file or sharded with an index) live in checkpoint.cpp.
//
// The reader parses and validates the header once, then reads each tensor with pread in chunks,
// converting to the caller's float or double. The writer lays tensors out like the Python package
// (larger element sizes first, then by name, so every tensor is aligned to its element size),
// pads the header with spaces to a multiple of 8 bytes and streams the file atomically: the
// tensors stay in the caller's memory and are converted chunk by chunk in one staging buffer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/memory.h"
#include "io/atomic_file.h"
#include "io/half_float.h"

namespace trillion {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The Python package refuses headers above 100 MB; so do we (a bogus length is caught early).
constexpr int64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kSupportedDtypes = "F32, F64, BF16, F16";

bool parse_dtype(const std::string& text, DType* dtype) {
  for (DType candidate : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    if (text == dtype_name(candidate)) {
      *dtype = candidate;
      return true;
    }
  }
  return false;
}

// Number of elements, or -1 if a dimension is negative or the product overflows.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(numel, dim, &numel)) return -1;
  }
  return numel;
}

// Reads exactly `bytes` bytes at `offset` of the open file, or fails naming the path.
void pread_exact(int fd, const std::string& path, int64_t offset, int64_t bytes, void* out) {
  char* dest = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t got = ::pread(fd, dest, static_cast<size_t>(bytes), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, ": read error at byte ", offset, ": ", std::strerror(errno));
    if (got == 0) fail(path, ": file is truncated: unexpected end of file at byte ", offset);
    dest += got;
    offset += got;
    bytes -= got;
  }
}

// Owns a read-only file descriptor for the lifetime of one operation.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) fail(path, ": cannot open for reading: ", std::strerror(errno));
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  int64_t size(const std::string& path) const {
    off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0) fail(path, ": cannot determine file size: ", std::strerror(errno));
    return static_cast<int64_t>(end);
  }

 private:
  int fd_;
};

// Converts `count` stored elements of `dtype` at `bytes` to T.
template <class T>
void decode_elements(DType dtype, const unsigned char* bytes, int64_t count, T* out) {
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::F32: {
        float value;
        std::memcpy(&value, bytes + 4 * i, 4);
        out[i] = static_cast<T>(value);
        break;
      }
      case DType::F64: {
        double value;
        std::memcpy(&value, bytes + 8 * i, 8);
        out[i] = static_cast<T>(value);
        break;
      }
      case DType::BF16:
      case DType::F16: {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        out[i] = static_cast<T>(dtype == DType::BF16 ? bf16_to_double(bits) : f16_to_double(bits));
        break;
      }
    }
  }
}

// Converts `count` values of T to `dtype`, rounding to nearest even where precision is lost.
template <class T>
void encode_elements(DType dtype, const T* values, int64_t count, unsigned char* bytes) {
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::F32: {
        float value = static_cast<float>(values[i]);
        std::memcpy(bytes + 4 * i, &value, 4);
        break;
      }
      case DType::F64: {
        double value = static_cast<double>(values[i]);
        std::memcpy(bytes + 8 * i, &value, 8);
        break;
      }
      case DType::BF16:
      case DType::F16: {
        double value = static_cast<double>(values[i]);
        uint16_t bits = dtype == DType::BF16 ? bf16_from_double(value) : f16_from_double(value);
        std::memcpy(bytes + 2 * i, &bits, 2);
        break;
      }
    }
  }
}

// Reads a non-negative integer field of a header entry.
int64_t header_integer(const nlohmann::json& value, const std::string& path, const std::string& name,
                       const char* field) {
  if (!value.is_number_integer())
    fail(path, ": tensor \"", name, "\": ", field, " entry ", value.dump(), " is not an integer");
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(path, ": tensor \"", name, "\": ", field, " entry ", value.dump(), " is too large");
  } else if (value.get<int64_t>() < 0) {
    fail(path, ": tensor \"", name, "\": ", field, " entry ", value.dump(), " is negative; expected >= 0");
  }
  return value.get<int64_t>();
}

TensorInfo parse_entry(const nlohmann::json& entry, const std::string& path, const std::string& name) {
  if (!entry.is_object())
    fail(path, ": tensor \"", name, "\": header entry is ", entry.type_name(),
         "; expected an object with dtype, shape and data_offsets");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) fail(path, ": tensor \"", name, "\": missing field \"", field, "\"");
  }
  TensorInfo info;
  const nlohmann::json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail(path, ": tensor \"", name, "\": dtype is ", dtype.dump(), "; expected a string");
  if (!parse_dtype(dtype.get<std::string>(), &info.dtype))
    fail(path, ": tensor \"", name, "\": unsupported dtype \"", dtype.get<std::string>(), "\"; expected one of ",
         kSupportedDtypes);
  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array()) fail(path, ": tensor \"", name, "\": shape is ", shape.dump(), "; expected an array");
  for (const nlohmann::json& dim : shape) info.shape.push_back(header_integer(dim, path, name, "shape"));
  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(path, ": tensor \"", name, "\": data_offsets is ", offsets.dump(), "; expected [begin, end]");
  info.begin = header_integer(offsets[0], path, name, "data_offsets");
  info.end = header_integer(offsets[1], path, name, "data_offsets");
  if (info.end < info.begin)
    fail(path, ": tensor \"", name, "\": data_offsets [", info.begin, ", ", info.end, "] end before begin");
  const int64_t numel = checked_numel(info.shape);
  int64_t expected_bytes = 0;
  if (numel < 0 || __builtin_mul_overflow(numel, dtype_bytes(info.dtype), &expected_bytes))
    fail(path, ": tensor \"", name, "\": shape ", shape_string(info.shape), " is too large");
  if (info.end - info.begin != expected_bytes)
    fail(path, ": tensor \"", name, "\": data_offsets [", info.begin, ", ", info.end, "] hold ",
         info.end - info.begin, " bytes; expected ", expected_bytes, " for shape ", shape_string(info.shape),
         " of ", dtype_name(info.dtype));
  return info;
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
  }
  return 0;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  InputFile file(path);
  const int64_t file_size = file.size(path);
  if (file_size < 8) fail(path, ": file is truncated: ", file_size, " bytes; a safetensors file has at least 8");
  uint64_t header_length = 0;
  pread_exact(file.fd(), path, 0, 8, &header_length);
  if (header_length > static_cast<uint64_t>(kMaxHeaderBytes))
    fail(path, ": header length ", header_length, " is not sane; expected at most ", kMaxHeaderBytes,
         " (not a safetensors file?)");
  if (static_cast<int64_t>(header_length) > file_size - 8)
    fail(path, ": header length ", header_length, " exceeds the file (", file_size,
         " bytes): file is truncated or not a safetensors file");
  std::string header_text(header_length, '\0');
  pread_exact(file.fd(), path, 8, static_cast<int64_t>(header_length), header_text.data());
  data_start_ = 8 + static_cast<int64_t>(header_length);
  const int64_t data_bytes = file_size - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": header is not valid JSON: ", error.what());
  }
  if (!header.is_object()) fail(path, ": header is ", header.type_name(), "; expected a JSON object");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, ": \"__metadata__\" is ", entry.type_name(), "; expected an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          fail(path, ": \"__metadata__\" field \"", key, "\" is ", value.dump(), "; expected a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    tensors_[name] = parse_entry(entry, path, name);
  }

  // Sorted by begin, each tensor must start at or after the end of the previous one and lie
  // inside the data section.
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : tensors_) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const auto& [name, info] = by_offset[i];
    if (i > 0 && info->begin < by_offset[i - 1].second->end) {
      const TensorInfo& previous = *by_offset[i - 1].second;
      fail(path, ": tensor \"", *name, "\": data_offsets [", info->begin, ", ", info->end, "] overlap tensor \"",
           *by_offset[i - 1].first, "\" [", previous.begin, ", ", previous.end, "]; expected disjoint ranges");
    }
    if (info->end > data_bytes)
      fail(path, ": tensor \"", *name, "\": data_offsets [", info->begin, ", ", info->end,
           "] out of range: the data section holds ", data_bytes, " bytes (file truncated?)");
  }
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, ": no tensor \"", name, "\" in this file");
  return it->second;
}

template <class T>
void SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& expected_shape, T* out) const {
  const TensorInfo& tensor = info(name);
  if (tensor.shape != expected_shape)
    fail(path_, ": tensor \"", name, "\": shape ", shape_string(tensor.shape), "; expected ", shape_string(expected_shape));
  InputFile file(path_);
  const int64_t element_bytes = dtype_bytes(tensor.dtype);
  const int64_t numel = (tensor.end - tensor.begin) / element_bytes;
  const bool same_layout = (tensor.dtype == DType::F32 && std::is_same_v<T, float>) ||
                           (tensor.dtype == DType::F64 && std::is_same_v<T, double>);
  if (same_layout) {
    pread_exact(file.fd(), path_, data_start_ + tensor.begin, tensor.end - tensor.begin, out);
    return;
  }
  constexpr int64_t kChunkElements = int64_t{1} << 18;
  std::vector<unsigned char> chunk(static_cast<size_t>(std::min(numel, kChunkElements) * element_bytes));
  for (int64_t first = 0; first < numel; first += kChunkElements) {
    const int64_t count = std::min(kChunkElements, numel - first);
    pread_exact(file.fd(), path_, data_start_ + tensor.begin + first * element_bytes, count * element_bytes,
                chunk.data());
    decode_elements(tensor.dtype, chunk.data(), count, out + first);
  }
}

template <class T>
void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const T* data) {
  if (name.empty() || name == "__metadata__") fail("safetensors writer: invalid tensor name \"", name, "\"");
  if (entries_.count(name) != 0) fail("safetensors writer: tensor \"", name, "\" added twice");
  const int64_t numel = checked_numel(shape);
  if (numel < 0) fail("safetensors writer: tensor \"", name, "\": invalid shape ", shape_string(shape));
  const DType held = std::is_same_v<T, double> ? DType::F64 : std::is_same_v<T, float> ? DType::F32 : DType::BF16;
  if (held == DType::BF16 && dtype != DType::BF16)
    fail("safetensors writer: tensor \"", name, "\": bf16 values are stored as BF16, not ", dtype_name(dtype));
  entries_.emplace(name, Entry{dtype, shape, numel, data, held});
}

int64_t SafetensorsWriter::data_bytes() const {
  int64_t total = 0;
  for (const auto& [name, entry] : entries_) total += entry.numel * dtype_bytes(entry.dtype);
  return total;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& item : entries_) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_bytes(a->second.dtype) > dtype_bytes(b->second.dtype);
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  const auto stored_as_held = [](const Entry& entry) {
    return entry.dtype == entry.held;
  };
  int64_t offset = 0;
  int64_t largest_converted_bytes = 0;  // of the tensors stored in another dtype than held (0: none)
  for (const auto* item : order) {
    const int64_t bytes = item->second.numel * dtype_bytes(item->second.dtype);
    header[item->first] = {{"dtype", dtype_name(item->second.dtype)},
                           {"shape", item->second.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    if (!stored_as_held(item->second)) largest_converted_bytes = std::max(largest_converted_bytes, bytes);
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  AtomicFileWriter file(path);
  const auto write_bytes = [&file](const void* bytes, int64_t count) {
    file.write(std::string_view(static_cast<const char*>(bytes), static_cast<size_t>(count)));
  };
  const uint64_t header_length = header_text.size();
  write_bytes(&header_length, 8);
  file.write(header_text);
  // Holds a whole number of elements of every tensor that needs it: kStagingBytes is a multiple
  // of 8, and a smaller buffer is the size of the largest such tensor (none: no buffer).
  Buffer<unsigned char> staging(std::min(kStagingBytes, largest_converted_bytes));
  for (const auto* item : order) {
    const Entry& entry = item->second;
    const int64_t element_bytes = dtype_bytes(entry.dtype);
    if (stored_as_held(entry)) {
      write_bytes(entry.data, entry.numel * element_bytes);
      continue;
    }
    const int64_t chunk_elements = staging.size() / element_bytes;
    for (int64_t first = 0; first < entry.numel; first += chunk_elements) {
      const int64_t count = std::min(chunk_elements, entry.numel - first);
      if (entry.held == DType::F64) {
        encode_elements(entry.dtype, static_cast<const double*>(entry.data) + first, count, staging.data());
      } else {
        encode_elements(entry.dtype, static_cast<const float*>(entry.data) + first, count, staging.data());
      }
      write_bytes(staging.data(), count * element_bytes);
    }
  }
  file.commit();
}

template void SafetensorsReader::read<float>(const std::string&, const std::vector<int64_t>&, float*) const;
template void SafetensorsReader::read<double>(const std::string&, const std::vector<int64_t>&, double*) const;
template void SafetensorsWriter::add<float>(const std::string&, DType, const std::vector<int64_t>&, const float*);
template void SafetensorsWriter::add<double>(const std::string&, DType, const std::vector<int64_t>&, const double*);
template void SafetensorsWriter::add<bf16>(const std::string&, DType, const std::vector<int64_t>&, const bf16*);

}  // namespace trillion
