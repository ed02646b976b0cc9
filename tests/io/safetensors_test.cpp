// safetensors reader and writer: round trips of every dtype from float and double, the layout the
// Python package uses (aligned header and data), a fixture written by the Python `safetensors`
// package (tools/ref/write_safetensors_fixture.py), and rejection of each kind of malformed file
// with a message naming the file, the tensor and the problem.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "io/atomic_file.h"
#include "io/half_float.h"
#include "io/test_files.h"
#include "test_support/scratch_dir.h"

namespace trillion {
namespace {

using testing::error_message;
using testing::safetensors_bytes;
using test::ScratchDir;
using testing::write_bytes;

const std::string kFixtureDir = std::string(TRILLION_SOURCE_DIR) + "/tests/fixtures/safetensors";

// Odd-sized values spanning magnitudes, signs and rounding cases.
std::vector<double> sample_values(int count) {
  std::vector<double> values;
  for (int i = 0; i < count; ++i) values.push_back(std::sin(1.7 * i + 0.3) * std::pow(10.0, (i % 7) - 3));
  values[0] = 0.0;
  values[1] = -0.0;
  values[2] = 1.0 + std::ldexp(1.0, -8);  // a bf16 tie (rounds to 1.0)
  values[3] = 1.0 + std::ldexp(1.0, -11);  // an f16 tie (rounds to 1.0)
  return values;
}

TEST(Safetensors, RoundTripsEveryDtypeFromDouble) {
  ScratchDir dir;
  const std::vector<double> values = sample_values(15);  // [3, 5]
  SafetensorsWriter writer;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16})
    writer.add(std::string("t_") + dtype_name(dtype), dtype, {3, 5}, values.data());
  writer.set_metadata("format", "pt");
  EXPECT_EQ(writer.data_bytes(), 15 * (4 + 8 + 2 + 2));
  writer.write(dir.path("all.safetensors"));

  SafetensorsReader reader(dir.path("all.safetensors"));
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.tensors().size(), 4u);
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const std::string name = std::string("t_") + dtype_name(dtype);
    EXPECT_EQ(reader.info(name).dtype, dtype);
    EXPECT_EQ(reader.info(name).shape, (std::vector<int64_t>{3, 5}));
    std::vector<double> as_double(15);
    std::vector<float> as_float(15);
    reader.read(name, {3, 5}, as_double.data());
    reader.read(name, {3, 5}, as_float.data());
    for (int i = 0; i < 15; ++i) {
      double expected = values[i];
      if (dtype == DType::F32) expected = static_cast<float>(values[i]);
      if (dtype == DType::BF16) expected = bf16_to_double(bf16_from_double(values[i]));
      if (dtype == DType::F16) expected = f16_to_double(f16_from_double(values[i]));
      EXPECT_EQ(as_double[i], expected) << name << " element " << i;
      EXPECT_EQ(as_float[i], static_cast<float>(expected)) << name << " element " << i;
      EXPECT_EQ(std::signbit(as_double[i]), std::signbit(values[i])) << name << " element " << i;
    }
  }
  std::vector<double> bf16(15), f16(15);
  reader.read("t_BF16", {3, 5}, bf16.data());
  reader.read("t_F16", {3, 5}, f16.data());
  EXPECT_EQ(bf16[2], 1.0);  // tie to even
  EXPECT_EQ(f16[3], 1.0);
}

TEST(Safetensors, RoundTripsFromFloatIncludingEmptyAndScalar) {
  ScratchDir dir;
  const std::vector<float> values = {1.5f, -3.25f, 1e-20f, 65536.0f, 0.1f, -7.0f, 3.0e38f};  // [7]
  SafetensorsWriter writer;
  writer.add("bf16", DType::BF16, {7}, values.data());
  writer.add("f64", DType::F64, {7}, values.data());
  writer.add("scalar", DType::F32, {}, values.data());
  writer.add("empty", DType::F16, {0, 3}, values.data());
  writer.write(dir.path("f.safetensors"));

  SafetensorsReader reader(dir.path("f.safetensors"));
  std::vector<float> bf16(7), f64(7), scalar(1);
  reader.read("bf16", {7}, bf16.data());
  reader.read("f64", {7}, f64.data());
  reader.read("scalar", {}, scalar.data());
  reader.read("empty", {0, 3}, static_cast<float*>(nullptr));
  EXPECT_EQ(f64, values);
  EXPECT_EQ(scalar[0], 1.5f);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(bf16[i], static_cast<float>(bf16_to_double(bf16_from_double(values[i]))));
  EXPECT_EQ(bf16[0], 1.5f);
  EXPECT_EQ(bf16[4], 0.10009765625f);  // 0.1 to 8 significant bits
  EXPECT_EQ(reader.info("empty").begin, reader.info("empty").end);
}

TEST(Safetensors, WritesThePythonPackageLayout) {
  ScratchDir dir;
  const std::vector<double> values = sample_values(5);
  SafetensorsWriter writer;
  writer.add("a_half", DType::F16, {1}, values.data());
  writer.add("b_double", DType::F64, {5}, values.data());
  writer.add("c_float", DType::F32, {3}, values.data());
  writer.write(dir.path("layout.safetensors"));

  const std::string bytes = read_file(dir.path("layout.safetensors"));
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_length + 2 + 40 + 12);
  const std::string header = bytes.substr(8, header_length);
  EXPECT_EQ(header.substr(0, 2), "{\"");
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));  // padded with spaces
  // Larger elements first, so every tensor is aligned to its element size.
  SafetensorsReader reader(dir.path("layout.safetensors"));
  EXPECT_EQ(reader.info("b_double").begin, 0);
  EXPECT_EQ(reader.info("c_float").begin, 40);
  EXPECT_EQ(reader.info("a_half").begin, 52);
  EXPECT_FALSE(std::filesystem::exists(dir.path("layout.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST(Safetensors, ReadsTheFileWrittenByThePythonPackage) {
  SafetensorsReader reader(kFixtureDir + "/reference.safetensors");
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_EQ(reader.metadata().at("producer"), "write_safetensors_fixture.py");
  ASSERT_EQ(reader.tensors().size(), 6u);

  std::vector<float> weight(6);
  reader.read("weight_f32", {2, 3}, weight.data());
  EXPECT_EQ(weight, (std::vector<float>{0.5f, -1.25f, 3.0f, 0.001f, -0.0f, 1e30f}));
  EXPECT_TRUE(std::signbit(weight[4]));
  std::vector<double> weight_double(6);
  reader.read("weight_f32", {2, 3}, weight_double.data());
  EXPECT_EQ(weight_double[3], static_cast<double>(0.001f));

  std::vector<double> bias(3);
  reader.read("bias_f64", {3}, bias.data());
  EXPECT_EQ(bias, (std::vector<double>{0.1, -2.5, 1e100}));
  std::vector<float> bias_float(3);
  reader.read("bias_f64", {3}, bias_float.data());
  EXPECT_EQ(bias_float[0], 0.1f);
  EXPECT_TRUE(std::isinf(bias_float[2]));

  EXPECT_EQ(reader.info("norm_bf16").dtype, DType::BF16);
  std::vector<double> norm(5);
  reader.read("norm_bf16", {5}, norm.data());
  EXPECT_EQ(norm, (std::vector<double>{1.0, -2.0, 0.15625, std::ldexp(1.0, -130), 3.3895313892515355e38}));

  EXPECT_EQ(reader.info("embed_f16").dtype, DType::F16);
  std::vector<float> embed(4);
  reader.read("embed_f16", {2, 2}, embed.data());
  EXPECT_EQ(embed, (std::vector<float>{1.0f, -0.5f, 65504.0f, std::ldexp(1.0f, -24)}));

  std::vector<double> scalar(1);
  reader.read("scalar", {}, scalar.data());
  EXPECT_EQ(scalar[0], 7.0);
  EXPECT_EQ(reader.info("empty").shape, (std::vector<int64_t>{0, 4}));
}

// --- malformed files ---

class MalformedSafetensors : public ::testing::Test {
 protected:
  // Writes a file with the given header and `data_bytes` zero bytes of data; returns the
  // reader's error message.
  std::string open_error(const std::string& header, size_t data_bytes) {
    write_bytes(path(), safetensors_bytes(header, std::string(data_bytes, '\0')));
    return error_message([&] { SafetensorsReader reader(path()); });
  }
  std::string path() const { return dir_.path("bad.safetensors"); }
  ScratchDir dir_;
};

TEST_F(MalformedSafetensors, OverlappingOffsets) {
  const std::string message = open_error(
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      24);
  EXPECT_NE(message.find(path()), std::string::npos) << message;
  EXPECT_NE(message.find("tensor \"b\": data_offsets [8, 24] overlap tensor \"a\" [0, 16]"), std::string::npos)
      << message;
}

TEST_F(MalformedSafetensors, OffsetsOutOfRange) {
  const std::string message = open_error(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[8,24]}})", 16);
  EXPECT_NE(message.find(path() + ": tensor \"w\": data_offsets [8, 24] out of range: the data section holds 16 bytes"),
            std::string::npos)
      << message;
}

TEST_F(MalformedSafetensors, UnsupportedDtype) {
  const std::string message = open_error(R"({"ids":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(message.find(path() + ": tensor \"ids\": unsupported dtype \"I32\"; expected one of F32, F64, BF16, F16"),
            std::string::npos)
      << message;
}

TEST_F(MalformedSafetensors, TruncatedFile) {
  const std::vector<float> values(10, 1.0f);
  SafetensorsWriter writer;
  writer.add("w", DType::F32, {10}, values.data());
  writer.write(path());
  std::filesystem::resize_file(path(), std::filesystem::file_size(path()) - 4);
  std::string message = error_message([&] { SafetensorsReader reader(path()); });
  EXPECT_NE(message.find(path()), std::string::npos) << message;
  EXPECT_NE(message.find("tensor \"w\""), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  std::filesystem::resize_file(path(), 20);  // cut inside the header
  message = error_message([&] { SafetensorsReader reader(path()); });
  EXPECT_NE(message.find("exceeds the file (20 bytes): file is truncated"), std::string::npos) << message;

  std::filesystem::resize_file(path(), 5);  // not even the length prefix
  message = error_message([&] { SafetensorsReader reader(path()); });
  EXPECT_NE(message.find("file is truncated: 5 bytes"), std::string::npos) << message;
}

TEST_F(MalformedSafetensors, BogusHeaderLength) {
  const uint64_t huge = uint64_t{1} << 40;
  write_bytes(path(), std::string(reinterpret_cast<const char*>(&huge), 8) + "{}");
  const std::string message = error_message([&] { SafetensorsReader reader(path()); });
  EXPECT_NE(message.find(path() + ": header length 1099511627776 is not sane; expected at most 100000000"),
            std::string::npos)
      << message;
}

TEST_F(MalformedSafetensors, HeaderNotJson) {
  EXPECT_NE(open_error("{\"a\": [1, 2", 0).find("header is not valid JSON"), std::string::npos);
  EXPECT_NE(open_error("[1, 2]  ", 0).find("header is array; expected a JSON object"), std::string::npos);
  EXPECT_NE(open_error(R"({"__metadata__":{"step":3}})", 0).find("\"__metadata__\" field \"step\" is 3; expected a string"),
            std::string::npos);
}

TEST_F(MalformedSafetensors, ShapeDoesNotMatchByteSize) {
  const std::string message = open_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
  EXPECT_NE(message.find(path() + ": tensor \"w\": data_offsets [0, 20] hold 20 bytes; expected 24 for shape [2, 3] of F32"),
            std::string::npos)
      << message;
}

TEST_F(MalformedSafetensors, NegativeShapeAndMissingFields) {
  std::string message = open_error(R"({"w":{"dtype":"F32","shape":[-1,3],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(message.find("tensor \"w\": shape entry -1 is negative; expected >= 0"), std::string::npos) << message;
  message = open_error(R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_NE(message.find("tensor \"w\": missing field \"data_offsets\""), std::string::npos) << message;
  message = open_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4);
  EXPECT_NE(message.find("tensor \"w\": data_offsets [4, 0] end before begin"), std::string::npos) << message;
}

TEST_F(MalformedSafetensors, WrongExpectedShapeOrNameOnRead) {
  const std::vector<double> values(6, 2.0);
  SafetensorsWriter writer;
  writer.add("w", DType::F64, {2, 3}, values.data());
  writer.write(path());
  SafetensorsReader reader(path());
  std::vector<double> out(6);
  std::string message = error_message([&] { reader.read("w", {3, 2}, out.data()); });
  EXPECT_EQ(message, path() + ": tensor \"w\": shape [2, 3]; expected [3, 2]");
  message = error_message([&] { reader.read("v", {2, 3}, out.data()); });
  EXPECT_EQ(message, path() + ": no tensor \"v\" in this file");
  message = error_message([&] { SafetensorsReader missing(dir_.path("missing.safetensors")); });
  EXPECT_NE(message.find("missing.safetensors: cannot open for reading"), std::string::npos) << message;
}

TEST(Safetensors, WriterRejectsBadTensors) {
  const std::vector<float> values(4);
  SafetensorsWriter writer;
  writer.add("w", DType::F32, {4}, values.data());
  EXPECT_NE(error_message([&] { writer.add("w", DType::F32, {4}, values.data()); }).find("tensor \"w\" added twice"),
            std::string::npos);
  EXPECT_NE(error_message([&] { writer.add("__metadata__", DType::F32, {4}, values.data()); })
                .find("invalid tensor name \"__metadata__\""),
            std::string::npos);
  EXPECT_NE(error_message([&] { writer.add("n", DType::F32, {-4}, values.data()); }).find("invalid shape [-4]"),
            std::string::npos);
}

}  // namespace
}  // namespace trillion
