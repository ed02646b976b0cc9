// Matrix products, row-major, and the linear layer in Hugging Face layout (weight [out, in]).
// float products run on oneDNN's dnnl_sgemm (its AVX2 and AVX-512 kernels; the default) or on
// OpenBLAS's cblas_sgemm; double products always run on OpenBLAS's cblas_dgemm. Both libraries are
// callable from inside the kernels' OpenMP regions, where they run on the calling thread.
// Under the bf16 matmul precision, float products take bfloat16 operands (below).
//
// linear_forward saves nothing: the backward reads the caller's x and w.
// Gradient rule: linear_backward writes (=) or accumulates (+=) dx as the caller says, and always
// accumulates (+=) dw. A null dx or dw skips that gradient (frozen weight, input that needs none).
#pragma once

#include <cstdint>
#include <string>

#include "core/bf16.h"
#include "core/memory.h"

namespace trillion {

// The library float products run on: one setting for the process (`--gemm`, or TRILLION_GEMM),
// made before the first product. Results are bitwise reproducible per backend, machine and thread
// count; the two backends round differently.
enum class GemmBackend { onednn, openblas };
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_backend();
const char* gemm_backend_name(GemmBackend backend);
// The backend a name gemm_backend_name gives; fails naming `option` and the names otherwise.
GemmBackend gemm_backend_from_name(const std::string& name, const char* option);

// The operands of float products: fp32, or bf16, where each product rounds its operands to
// bfloat16 and accumulates in float, as PyTorch's bf16 autocast and
// torch.set_float32_matmul_precision("medium") do. Results, and everything between products, stay
// float. One setting for the process (a training run's `--precision`), made before the products it
// governs; double products are never rounded. docs/architecture.md, "Mixed precision".
enum class MatmulPrecision { fp32, bf16 };
void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();
const char* matmul_precision_name(MatmulPrecision precision);
// The precision a name matmul_precision_name gives; fails naming `option` and the names otherwise.
MatmulPrecision matmul_precision_from_name(const std::string& name, const char* option);

// Sets the matmul precision for its lifetime, then restores the one before (benchmarks, tests).
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision precision) : before_(matmul_precision()) {
    set_matmul_precision(precision);
  }
  ~MatmulPrecisionScope() { set_matmul_precision(before_); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision before_;
};

// A bf16 copy of a float buffer that float products under the bf16 precision read instead of
// rounding an operand lying inside the buffer: the copy's elements at the operand's offset, with its
// strides. The operands are the same, so are the results; each value is rounded once instead of at
// each product. Registered from construction to destruction, which happen outside products (on
// the thread that runs the regions); the copies' source buffers are disjoint. Whoever registers a
// copy keeps it equal to to_bf16(source) where products may read it; FSDP's copy stands in for
// float weights it never gathers (parallel/fsdp.h), and holds no values where only other kernels read.
class RegisteredBf16Copy {
 public:
  RegisteredBf16Copy(const float* source, const bf16* copy, int64_t size);
  ~RegisteredBf16Copy();
  RegisteredBf16Copy(const RegisteredBf16Copy&) = delete;
  RegisteredBf16Copy& operator=(const RegisteredBf16Copy&) = delete;

 private:
  const bf16* copy_;
};

// A registered bf16 copy that owns its elements: a model's parameters, whose copy the owner
// refreshes after every change of the buffer, before the products that read it (Model: at the
// start of each forward), so each weight is rounded once per forward instead of at each product
// (and the LM head's at each of its row chunks).
class Bf16OperandCopy {
 public:
  Bf16OperandCopy(const float* source, int64_t size);

  void refresh();  // copy = to_bf16(source): one parallel pass
  void refresh(int64_t begin, int64_t end);  // elements begin .. end only
  const bf16* data() const { return copy_.data(); }  // [size]

 private:
  const float* source_;
  int64_t size_;
  Buffer<bf16> copy_;  // [size]
  RegisteredBf16Copy registration_;
};

// What a float product's operands are: as the matmul precision says, or float whatever it says
// (products whose small differences decide discrete choices, such as the router's logits).
enum class Operands { as_set, fp32 };

// c[m, n] = alpha · op(a) · op(b) + beta · c; op(a) is [m, k], op(b) is [k, n]; lda/ldb/ldc are the
// row strides of a, b, c as stored. beta 0 does not read c.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc, Operands operands = Operands::as_set);

// The same with bfloat16 operands, float accumulation and a float c: oneDNN's bf16 matmul where
// the CPU has one (AVX-512), otherwise the operands widened to float (exactly) for the float
// backend. The products of bf16 values are exact in float, so both differ only in summation order.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Whether gemm_bf16 runs on oneDNN's bf16 matmul (false: on widened operands).
bool bf16_matmul_is_native();
// The bf16 matmul primitives the calling thread has built: one per transposes, alpha, beta and team
// size, whatever the sizes and strides of the products.
int64_t bf16_matmul_primitives_on_this_thread();

// y[rows, out] = x[rows, in] · w[out, in]ᵀ
template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t rows, int64_t in, int64_t out,
                    Operands operands = Operands::as_set);

// dx[rows, in] (= or +=) dy[rows, out] · w[out, in];  dw[out, in] += dyᵀ · x.
template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx, Operands operands = Operands::as_set);

}  // namespace trillion
