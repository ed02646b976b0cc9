// File output through the replaceable FileOutput: the streamed safetensors writer produces the
// same bytes as the former writer that concatenated the whole file in memory; every open, write,
// fsync, close, rename and directory sync failing in turn, at every position, gives an error
// naming the path and the step, leaves no temporary file and leaves the previous file intact;
// short writes are retried; and streaming needs only the staging buffer, not the file's size.
#include "io/file_output.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "io/atomic_file.h"
#include "io/half_float.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;
using test::ScratchDir;
using testing::write_bytes;

// One tensor as the reference writer sees it: values held as double, or as float when
// `as_float` is set.
struct ReferenceTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;
  std::vector<float> float_values;
  bool as_float;
};

// The former SafetensorsWriter: each tensor encoded into its own vector, then header and data
// concatenated into one string (same order, header and padding).
std::string reference_file_bytes(std::vector<ReferenceTensor> tensors, const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const auto& a, const auto& b) { return dtype_bytes(a.dtype) > dtype_bytes(b.dtype); });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const ReferenceTensor& tensor : tensors) {
    const int64_t begin = static_cast<int64_t>(data.size());
    const size_t count = tensor.as_float ? tensor.float_values.size() : tensor.values.size();
    for (size_t i = 0; i < count; ++i) {
      const double value = tensor.as_float ? tensor.float_values[i] : tensor.values[i];
      const float single = static_cast<float>(value);
      const uint16_t half = tensor.dtype == DType::BF16 ? bf16_from_double(value) : f16_from_double(value);
      switch (tensor.dtype) {
        case DType::F32: data.append(reinterpret_cast<const char*>(&single), 4); break;
        case DType::F64: data.append(reinterpret_cast<const char*>(&value), 8); break;
        case DType::BF16:
        case DType::F16: data.append(reinterpret_cast<const char*>(&half), 2); break;
      }
    }
    header[tensor.name] = {{"dtype", dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {begin, static_cast<int64_t>(data.size())}}};
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();
  return std::string(reinterpret_cast<const char*>(&header_length), 8) + header_text + data;
}

ReferenceTensor make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, bool as_float) {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  ReferenceTensor tensor{name, dtype, std::move(shape), {}, {}, as_float};
  for (int64_t i = 0; i < numel; ++i) {
    const double value = std::sin(0.37 * double(i) + 0.1) * std::pow(10.0, double(i % 9) - 4);
    if (as_float) tensor.float_values.push_back(static_cast<float>(value));
    else tensor.values.push_back(value);
  }
  return tensor;
}

// Every dtype from float and double, a scalar, an empty tensor, and a BF16 tensor of several
// staging buffers (so the data goes out in several chunks).
std::vector<ReferenceTensor> sample_tensors() {
  const int64_t chunked = SafetensorsWriter::kStagingBytes + 123;  // 2 bytes each: 3 staging buffers
  return {make_tensor("w_f32_from_float", DType::F32, {3, 5}, true),
          make_tensor("w_f32_from_double", DType::F32, {7}, false),
          make_tensor("w_f64_from_double", DType::F64, {2, 3}, false),
          make_tensor("w_f64_from_float", DType::F64, {5}, true),
          make_tensor("w_f16", DType::F16, {9}, false),
          make_tensor("w_bf16_chunked", DType::BF16, {chunked}, true),
          make_tensor("scalar", DType::F32, {}, false),
          make_tensor("empty", DType::BF16, {0, 4}, true)};
}

void add_all(SafetensorsWriter& writer, const std::vector<ReferenceTensor>& tensors) {
  for (const ReferenceTensor& tensor : tensors) {
    if (tensor.as_float) writer.add(tensor.name, tensor.dtype, tensor.shape, tensor.float_values.data());
    else writer.add(tensor.name, tensor.dtype, tensor.shape, tensor.values.data());
  }
}

size_t entries_in(const std::string& directory) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(directory),
                                           std::filesystem::directory_iterator()));
}

TEST(FileOutput, StreamedSafetensorsMatchTheConcatenatingWriter) {
  ScratchDir dir;
  const std::vector<ReferenceTensor> tensors = sample_tensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"producer", "trillion"}};
  SafetensorsWriter writer;
  add_all(writer, tensors);
  for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
  writer.write(dir.path("streamed.safetensors"));
  const std::string expected = reference_file_bytes(tensors, metadata);
  EXPECT_EQ(read_file(dir.path("streamed.safetensors")), expected);
  uint64_t header_length = 0;
  std::memcpy(&header_length, expected.data(), 8);
  EXPECT_EQ(static_cast<uint64_t>(writer.data_bytes()), expected.size() - 8 - header_length);
  EXPECT_EQ(entries_in(dir.path()), 1u);  // no temporary file left
}

TEST(FileOutput, ShortWritesAreRetried) {
  ScratchDir dir;
  const std::vector<ReferenceTensor> tensors = {make_tensor("a", DType::F32, {33}, true),
                                                make_tensor("b", DType::BF16, {17}, false)};
  FaultInjectingFileOutput output;
  output.limit_write_size(5);
  ScopedFileOutput scope(output);
  SafetensorsWriter writer;
  add_all(writer, tensors);
  writer.write(dir.path("short.safetensors"));
  const std::string expected = reference_file_bytes(tensors, {});
  EXPECT_EQ(read_file(dir.path("short.safetensors")), expected);
  EXPECT_GE(output.count(FileOperation::write), static_cast<int64_t>(expected.size() / 5));

  write_file_atomic(dir.path("short.txt"), "twenty-three bytes long");
  EXPECT_EQ(read_file(dir.path("short.txt")), "twenty-three bytes long");
}

// What a failure of each kind must say, after the path it names.
std::string expected_complaint(FileOperation operation) {
  switch (operation) {
    case FileOperation::open: return ": cannot create temporary file ";
    case FileOperation::write: return ": cannot write: ";
    case FileOperation::fsync: return ": cannot fsync ";
    case FileOperation::close: return ": cannot close ";
    case FileOperation::rename: return ": cannot rename ";
    case FileOperation::sync_directory: return ": cannot fsync directory: ";
    case FileOperation::remove:
    case FileOperation::make_directory:
    case FileOperation::exchange: break;
  }
  return "?";
}

// Runs `write_new` (which writes `path`, in `directory`) with each operation kind failing at each
// of its positions in turn. Before the rename, the file that was at `path` must survive byte for
// byte; a failed directory sync comes after the rename, so the new file is in place, complete.
void check_every_failure(const std::string& directory, const std::string& path, const std::function<void()>& write_new) {
  const std::string old_bytes = "the previous file\n";
  FaultInjectingFileOutput counter;
  {
    ScopedFileOutput scope(counter);
    write_new();
  }
  const std::string new_bytes = read_file(path);
  for (FileOperation operation : {FileOperation::open, FileOperation::write, FileOperation::fsync, FileOperation::close,
                                  FileOperation::rename, FileOperation::sync_directory}) {
    ASSERT_GE(counter.count(operation), 1) << file_operation_name(operation);
    for (int64_t nth = 1; nth <= counter.count(operation); ++nth) {
      SCOPED_TRACE(str_cat(file_operation_name(operation), " #", nth));
      write_bytes(path, old_bytes);
      const int error = operation == FileOperation::write ? ENOSPC : EIO;
      FaultInjectingFileOutput output;
      output.fail_nth(operation, nth, error);
      ScopedFileOutput scope(output);
      const std::string message = error_message(write_new);
      const std::string named = operation == FileOperation::sync_directory ? directory : path;
      EXPECT_EQ(message.rfind(named + expected_complaint(operation), 0), 0u) << message;
      EXPECT_NE(message.find(std::strerror(error)), std::string::npos) << message;
      EXPECT_EQ(entries_in(directory), 1u) << "a temporary file was left behind";
      EXPECT_EQ(read_file(path), operation == FileOperation::sync_directory ? new_bytes : old_bytes);
    }
  }
}

TEST(FileOutput, EveryFailureOfASafetensorsWriteIsCleanAndKeepsThePreviousFile) {
  ScratchDir dir;
  const std::vector<ReferenceTensor> tensors = sample_tensors();
  SafetensorsWriter writer;
  add_all(writer, tensors);
  const std::string path = dir.path("model.safetensors");
  check_every_failure(dir.path(), path, [&] { writer.write(path); });
}

TEST(FileOutput, EveryFailureOfAnAtomicWriteIsCleanAndKeepsThePreviousFile) {
  ScratchDir dir;
  const std::string path = dir.path("latest");
  check_every_failure(dir.path(), path, [&] { write_file_atomic(path, "checkpoint-00000042\n"); });
}

TEST(FileOutput, NoSpaceOnTheThirdWriteOfAStreamedFileFailsCleanly) {
  ScratchDir dir;
  const std::vector<ReferenceTensor> tensors = sample_tensors();
  SafetensorsWriter writer;
  add_all(writer, tensors);
  const std::string path = dir.path("model.safetensors");
  FaultInjectingFileOutput output;
  output.fail_nth(FileOperation::write, 3, ENOSPC);
  ScopedFileOutput scope(output);
  EXPECT_EQ(error_message([&] { writer.write(path); }), path + ": cannot write: " + std::strerror(ENOSPC));
  EXPECT_EQ(output.count(FileOperation::write), 3);  // stopped at the failure
  EXPECT_EQ(output.count(FileOperation::rename), 0);
  EXPECT_EQ(output.count(FileOperation::remove), 1);  // the temporary file
  EXPECT_EQ(entries_in(dir.path()), 0u);
}

TEST(FileOutput, DirectoriesThatRefuseFsyncAreAccepted) {
  ScratchDir dir;
  FaultInjectingFileOutput output;
  output.fail_nth(FileOperation::sync_directory, 1, EINVAL);
  ScopedFileOutput scope(output);
  write_file_atomic(dir.path("out.txt"), "kept");
  EXPECT_EQ(read_file(dir.path("out.txt")), "kept");
  EXPECT_EQ(output.count(FileOperation::sync_directory), 1);
}

TEST(FileOutput, AbandonedStreamRemovesItsTemporaryFile) {
  ScratchDir dir;
  write_bytes(dir.path("out.bin"), "old");
  {
    AtomicFileWriter file(dir.path("out.bin"));
    file.write("partial new contents");
    EXPECT_TRUE(std::filesystem::exists(file.temp_path()));
  }
  EXPECT_EQ(entries_in(dir.path()), 1u);
  EXPECT_EQ(read_file(dir.path("out.bin")), "old");
}

// Records where every write's bytes came from, so a test can tell a write from the caller's own
// memory from one out of a staging buffer.
class WriteRecordingFileOutput : public PosixFileOutput {
 public:
  struct Write {
    const char* data;
    size_t size;
  };
  int write_some(int descriptor, const char* data, size_t size, size_t* written) override {
    writes.push_back({data, size});
    return PosixFileOutput::write_some(descriptor, data, size, written);
  }
  std::vector<Write> writes;
};

TEST(FileOutput, StreamingNeedsOnlyTheStagingBufferNotTheFileSize) {
  ScratchDir dir;
  const int64_t staging = SafetensorsWriter::kStagingBytes;
  Buffer<float> converted(2 * staging);  // 4 staging buffers once stored as BF16
  Buffer<float> direct(staging);         // stored as F32: straight from this memory
  for (int64_t i = 0; i < converted.size(); ++i) converted[i] = 0.001f * float(i % 1000);
  for (int64_t i = 0; i < direct.size(); ++i) direct[i] = float(i);
  SafetensorsWriter writer;
  writer.add("converted", DType::BF16, {converted.size()}, converted.data());
  writer.add("direct", DType::F32, {direct.size()}, direct.data());

  WriteRecordingFileOutput output;
  ScopedFileOutput scope(output);
  const int64_t before = MemoryStats::current(Tier::fast);
  MemoryStats::reset_peak(Tier::fast);
  writer.write(dir.path("big.safetensors"));
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(dir.path("big.safetensors")));
  EXPECT_GT(file_bytes, 8 * staging);
  EXPECT_LE(MemoryStats::peak(Tier::fast) - before, staging);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);

  const char* direct_bytes = reinterpret_cast<const char*>(direct.data());
  int64_t written_from_caller = 0;
  for (const auto& write : output.writes) {
    const bool from_caller = write.data >= direct_bytes && write.data < direct_bytes + direct.size() * 4;
    if (from_caller) written_from_caller += static_cast<int64_t>(write.size);
    else EXPECT_LE(static_cast<int64_t>(write.size), staging);  // header or one staging buffer
  }
  EXPECT_EQ(written_from_caller, direct.size() * 4);  // no copy of the F32 tensor at all
}

}  // namespace
}  // namespace trillion
