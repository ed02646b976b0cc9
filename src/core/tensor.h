// Tensor<T>: a non-owning, row-major, contiguous view with a shape of up to 6 dimensions.
// Storage comes from core/memory.h (Buffer::view, Arena::tensor hand out views); expect_shape aborts
// with file and line on a mismatch. Ops take raw pointers plus sizes (llm.c style, shapes in
// comments), and so do the modules; Shape describes the activation store's saved tensors
// (memory/activation_store.h), and views serve tests and code that passes tensors around.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace trillion {

class Shape {
 public:
  static constexpr int kMaxRank = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    TRILLION_CHECK(static_cast<int>(dims.size()) <= kMaxRank, "rank ", dims.size(), " > ", kMaxRank);
    for (int64_t d : dims) dims_[rank_++] = d;
  }
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? i + rank_ : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Shape without its first dimension.
  Shape tail() const {
    Shape s;
    for (int i = 1; i < rank_; ++i) s.dims_[s.rank_++] = dims_[i];
    return s;
  }
  bool operator==(const Shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + "]";
  }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

template <class T>
class Tensor {
 public:
  Tensor() = default;
  Tensor(T* data, Shape shape) : data_(data), shape_(shape) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  T& operator[](int64_t i) const { return data_[i]; }

  // The i-th sub-tensor along the first dimension.
  Tensor slice(int64_t i) const {
    TRILLION_CHECK(rank() >= 1 && i >= 0 && i < dim(0), "slice ", i, " of ", shape_.str());
    Shape t = shape_.tail();
    return Tensor(data_ + i * t.numel(), t);
  }
  // Same elements, another shape of the same size.
  Tensor reshape(Shape s) const {
    TRILLION_CHECK(s.numel() == numel(), "reshape ", shape_.str(), " to ", s.str());
    return Tensor(data_, s);
  }
  void expect_shape(const Shape& expected, const char* name) const {
    TRILLION_CHECK(shape_ == expected, name, " has shape ", shape_.str(), ", expected ", expected.str());
  }
  operator Tensor<const T>() const { return Tensor<const T>(data_, shape_); }

 private:
  T* data_ = nullptr;
  Shape shape_;
};

}  // namespace trillion
