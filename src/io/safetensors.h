// safetensors reader and writer (https://github.com/huggingface/safetensors format):
//   8-byte little-endian header length N, N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
//   then the data; offsets are relative to the end of the header.
// Supported dtypes: F32, F64, BF16, F16 (converted to/from the caller's float or double).
// Reading validates the header: JSON, dtypes, shapes vs byte sizes, offsets in range, sorted and
// non-overlapping, file length; every error names the file and the tensor (trillion::Error).
// Writing streams to a temporary file, fsync, rename (never a half-written file under the real name).
// Sharded checkpoints: `model.safetensors.index.json` with {"metadata": {"total_size": ..},
// "weight_map": {name: shard file}}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace trillion {

enum class DType { F32, F64, BF16, F16 };
const char* dtype_name(DType dtype);
int64_t dtype_bytes(DType dtype);
// The dtype that stores T without loss: F32 for float, F64 for double.
template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::F64 : DType::F32;
}
// A shape as error messages print it: "[2, 3]".
std::string shape_string(const std::vector<int64_t>& shape);

struct TensorInfo {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets relative to the data section
  int64_t end = 0;
};

class SafetensorsReader {
 public:
  // Opens and validates; throws trillion::Error naming the file on any defect.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // error if absent
  // Reads a tensor converted to T; the shape must equal `expected_shape` (error otherwise).
  template <class T>
  void read(const std::string& name, const std::vector<int64_t>& expected_shape, T* out) const;

 private:
  std::string path_;
  int64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes them atomically. add() keeps only a pointer to the caller's data,
// which must stay alive and unchanged until write() returns: nothing is copied up front.
// write() streams the header and then each tensor through an AtomicFileWriter, converting to the
// stored dtype in a staging buffer of at most kStagingBytes (a tensor stored in its own
// layout, F32 from float, F64 from double or BF16 from bf16 (stored only as BF16), is written
// straight from the caller's memory).
class SafetensorsWriter {
 public:
  static constexpr int64_t kStagingBytes = int64_t{1} << 20;

  template <class T>
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const T* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  int64_t data_bytes() const;
  void write(const std::string& path) const;  // temp file + fsync + rename

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    int64_t numel;
    const void* data;  // the caller's float, double or bf16 values
    DType held;        // their type (F32, F64, BF16)
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: either `model.safetensors` or shards listed by
// `model.safetensors.index.json`. Opens every shard and maps tensor names to readers.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& directory);
  bool contains(const std::string& name) const;
  const SafetensorsReader& shard_of(const std::string& name) const;  // error naming the tensor if absent
  std::vector<std::string> names() const;
  template <class T>
  void read(const std::string& name, const std::vector<int64_t>& expected_shape, T* out) const {
    shard_of(name).read(name, expected_shape, out);
  }

 private:
  std::string directory_;
  std::vector<SafetensorsReader> shards_;
  std::map<std::string, size_t> shard_index_;
};

// Writes tensors in insertion order into shards of at most max_shard_bytes each
// (model-00001-of-0000N.safetensors + model.safetensors.index.json), or a single
// model.safetensors when everything fits in one. Like SafetensorsWriter, it keeps pointers to the
// caller's data, which must stay alive until write() returns.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(int64_t max_shard_bytes = int64_t{2} << 30) : max_shard_bytes_(max_shard_bytes) {}
  template <class T>
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const T* data);
  void write(const std::string& directory) const;

 private:
  int64_t max_shard_bytes_;
  std::vector<SafetensorsWriter> shards_;                  // filled as tensors are added
  std::vector<std::pair<std::string, size_t>> placement_;  // tensor name → index in shards_, insertion order
};

}  // namespace trillion
