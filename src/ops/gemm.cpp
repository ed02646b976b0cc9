// Matrix products through oneDNN (dnnl_sgemm, row-major; its bf16 matmul primitive) or OpenBLAS
// (row-major cblas), and the Hugging Face linear layer built on them. Called inside an OpenMP
// region, both run single-threaded (oneDNN's OpenMP runtime runs nested work on the calling thread,
// OpenBLAS's OpenMP build too), so kernels that tile their work over the team may call gemm() from
// their items.
//
// bf16 operands: oneDNN's C API has no bf16 GEMM, so gemm_bf16 builds a runtime-shaped matmul
// primitive (cached per thread) where oneDNN has a bf16 kernel for the CPU (AVX-512: avx512_core
// emulates, avx512_core_bf16 has the dot-product instruction, which flushes subnormal inputs to zero,
// as the emulation and widening do not). Elsewhere (AVX2) the operands are widened to float, which
// is exact, for the float backend. A float product under the bf16 precision reads each
// operand from a registered bf16 copy (Bf16OperandCopy) or packs it rounded into a per-thread buffer
// first, then runs as gemm_bf16 does.
#include "ops/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/phase_clock.h"
#include "ops/vector_exp.h"

namespace trillion {
namespace {

std::atomic<GemmBackend> g_backend{GemmBackend::onednn};
std::atomic<MatmulPrecision> g_precision{MatmulPrecision::fp32};

// TRILLION_ISA=avx2 limits oneDNN's kernels to AVX2 as it does the engine's vector kernels
// (ops/vector_exp.h), so the AVX2 path runs on AVX-512 machines too; set once, before oneDNN's
// first product.
void limit_onednn_isa_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* forced = std::getenv("TRILLION_ISA");
    if (forced == nullptr || *forced == '\0' || vector_isa() != VectorIsa::avx2) return;
    const dnnl_status_t status = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    TRILLION_CHECK(status == dnnl_success, "oneDNN refused to limit its kernels to AVX2: status ", int(status));
  });
}

void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  limit_onednn_isa_once();
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TRILLION_CHECK(status == dnnl_success, "dnnl_sgemm m=", m, " n=", n, " k=", k, " failed: status ", int(status));
}

CBLAS_TRANSPOSE cblas_trans(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(trans_a), cblas_trans(trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, cblas_trans(trans_a), cblas_trans(trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// ThreadSanitizer builds run the libraries on the calling thread: the threads of their own OpenMP
// regions synchronize in libgomp, which TSan cannot see (core/parallel.h announces only the engine's
// regions), so their writes to C would read as races. Both take their thread count from
// omp_get_max_threads() at each call. Other builds leave them their threads.
struct LibraryOnCallingThread {
#if defined(__SANITIZE_THREAD__)
  const int saved = omp_get_max_threads();
  LibraryOnCallingThread() { omp_set_num_threads(1); }
  ~LibraryOnCallingThread() { omp_set_num_threads(saved); }
#endif
};


// c[m, n] = beta · c, the product of an empty sum (k = 0), which the libraries refuse or skip;
// beta 0 does not read c.
template <class T>
void scale_rows(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
}

// ---- bf16 operands ----

// The stored extent of op(x) = [rows, cols] as the caller holds it: [rows, cols] or, transposed,
// [cols, rows]; each stored row of `ld` elements.
struct StoredMatrix {
  int64_t rows, cols, ld;
  int64_t packed_ld() const { return cols > 1 ? cols : 1; }  // the libraries refuse a stride of 0
};
StoredMatrix stored(bool trans, int64_t op_rows, int64_t op_cols, int64_t ld) {
  return trans ? StoredMatrix{op_cols, op_rows, ld} : StoredMatrix{op_rows, op_cols, ld};
}

// dst[rows, packed_ld] = src[rows, ld] converted row by row (core/bf16.h's array conversions).
template <class Out, class In>
void pack(const StoredMatrix& shape, const In* src, std::vector<Out>& dst) {
  dst.resize(size_t(shape.rows * shape.packed_ld()));
  Out* packed = dst.data();
  parallel_for(shape.rows, shape.cols, [&](int64_t r) {
    if constexpr (std::is_same_v<Out, bf16>) {
      to_bf16(src + r * shape.ld, packed + r * shape.packed_ld(), shape.cols);  // [cols] each
    } else {
      to_float(src + r * shape.ld, packed + r * shape.packed_ld(), shape.cols);
    }
  });
}

// Each thread's operand buffers, grown to the largest product it has packed.
struct PackedOperands {
  std::vector<bf16> a_bf16, b_bf16;
  std::vector<float> a_float, b_float;
};
thread_local PackedOperands t_packed;

// One oneDNN bf16 matmul per transposes, alpha/beta and team size, its sizes and strides given at
// each call (DNNL_RUNTIME_DIM_VAL): the expert chain's row tiles change size every step, and a
// primitive per shape (each with its generated kernels) made the resident memory grow by hundreds of
// MB over a run's first steps. The runtime-shaped primitive is oneDNN's jit GEMM, as fast as its
// per-shape brgemm kernels at the engine's shapes (docs/benchmarks.md, "bf16 matmul primitives").
// Built on first use by the thread that runs it (oneDNN's scratchpad is per creating thread: a
// primitive must run where it was made); inside an OpenMP region it is built for one thread, as it
// then runs. The team size is in the key because it sets the split of k, hence the summation order:
// results depend on the thread count only, not on which came first.
using MatmulKey = std::tuple<bool, bool, float, float, int>;
struct Bf16Matmul {
  bool native = false;  // false: oneDNN has no bf16 kernel for this CPU (use widening)
  bool trans_a = false, trans_b = false;
  dnnl::matmul primitive;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// a [m, k] (or stored [k, m]), b [k, n] (or stored [n, k]) in bf16 and c [m, n] in float, each row
// `ld` apart; DNNL_RUNTIME_DIM_VAL for sizes and strides describes the runtime-shaped primitive.
struct MatmulDescs {
  dnnl::memory::desc a, b, c;
};
MatmulDescs matmul_descs(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                         int64_t ldc) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  return {dnnl::memory::desc({m, k}, dt::bf16, trans_a ? dims{1, lda} : dims{lda, 1}),
          dnnl::memory::desc({k, n}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1}),
          dnnl::memory::desc({m, n}, dt::f32, dims{ldc, 1})};
}

Bf16Matmul make_bf16_matmul(bool trans_a, bool trans_b, float alpha, float beta) {
  limit_onednn_isa_once();
  Bf16Matmul result;
  result.trans_a = trans_a;
  result.trans_b = trans_b;
  constexpr int64_t any = DNNL_RUNTIME_DIM_VAL;
  const MatmulDescs descs = matmul_descs(trans_a, trans_b, any, any, any, any, any, any);
  dnnl::primitive_attr attributes;
  if (alpha != 1.0f) attributes.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops accumulate;
    accumulate.append_sum(beta);
    attributes.set_post_ops(accumulate);
  }
  const int threads = omp_get_max_threads();
  if (omp_in_parallel()) omp_set_num_threads(1);
  try {
    const dnnl::matmul::primitive_desc description(dnnl::matmul::desc(descs.a, descs.b, descs.c), attributes,
                                                   cpu_engine());
    // oneDNN's reference kernel computes correctly but far below the float backend's rate.
    if (std::strncmp(description.impl_info_str(), "ref", 3) != 0) {
      result.primitive = dnnl::matmul(description);
      result.native = true;
    }
  } catch (const dnnl::error&) {
    // unimplemented for this CPU (no AVX-512): the caller widens
  }
  omp_set_num_threads(threads);
  return result;
}

std::map<MatmulKey, Bf16Matmul>& thread_matmuls() {
  thread_local std::map<MatmulKey, Bf16Matmul> cache;
  return cache;
}

const Bf16Matmul& bf16_matmul(bool trans_a, bool trans_b, float alpha, float beta) {
  std::map<MatmulKey, Bf16Matmul>& cache = thread_matmuls();
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();  // threads the primitive is built for
  const MatmulKey key{trans_a, trans_b, alpha, beta, team};
  auto found = cache.find(key);
  if (found == cache.end()) found = cache.emplace(key, make_bf16_matmul(trans_a, trans_b, alpha, beta)).first;
  return found->second;
}

// c[m, n] = alpha · a · b + beta · c on oneDNN's bf16 matmul, a and b transposed as `matmul` was
// built for.
void execute(const Bf16Matmul& matmul, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda, const bf16* b,
             int64_t ldb, float* c, int64_t ldc) {
  thread_local dnnl::stream stream(cpu_engine());
  const dnnl::engine& engine = cpu_engine();
  const MatmulDescs descs = matmul_descs(matmul.trans_a, matmul.trans_b, m, n, k, lda, ldb, ldc);
  dnnl::memory a_memory(descs.a, engine, const_cast<bf16*>(a)), b_memory(descs.b, engine, const_cast<bf16*>(b)),
      c_memory(descs.c, engine, c);
  matmul.primitive.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
  stream.wait();
}

// The product of bf16 operands on the float backend, widened to float (exactly) and packed dense.
void widened_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
                     int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const StoredMatrix a_shape = stored(trans_a, m, k, lda), b_shape = stored(trans_b, k, n, ldb);
  pack(a_shape, a, t_packed.a_float);  // [a_shape.rows, a_shape.cols]
  pack(b_shape, b, t_packed.b_float);  // [b_shape.rows, b_shape.cols]
  gemm<float>(trans_a, trans_b, m, n, k, alpha, t_packed.a_float.data(), a_shape.packed_ld(), t_packed.b_float.data(),
              b_shape.packed_ld(), beta, c, ldc, Operands::fp32);
}

// The registered bf16 copies (Bf16OperandCopy): the byte range of each source and its copy.
struct RegisteredCopy {
  uintptr_t begin, end;  // [begin, end) of the source's bytes
  const bf16* copy;      // [size]
};
std::vector<RegisteredCopy>& registered_copies() {
  static std::vector<RegisteredCopy> copies;
  return copies;
}

// The copy's element of the stored operand's first element, or null where no registered copy holds
// the whole of it.
const bf16* registered_copy_of(const float* x, const StoredMatrix& shape) {
  const auto begin = reinterpret_cast<uintptr_t>(x);
  const auto end = reinterpret_cast<uintptr_t>(x + (shape.rows - 1) * shape.ld + shape.cols);
  for (const RegisteredCopy& r : registered_copies())
    if (begin >= r.begin && end <= r.end) return r.copy + (begin - r.begin) / sizeof(float);
  return nullptr;
}

// An operand in bf16 for the matmul: its registered copy in place (the caller's strides), or rounded
// and packed dense into `buffer`.
struct Bf16Operand {
  const bf16* data;
  int64_t ld;
};
Bf16Operand bf16_operand(const float* x, const StoredMatrix& shape, std::vector<bf16>& buffer) {
  if (const bf16* copy = registered_copy_of(x, shape)) return {copy, shape.ld};
  pack(shape, x, buffer);  // [shape.rows, shape.cols]
  return {buffer.data(), shape.packed_ld()};
}

// A float product under the bf16 precision.
void gemm_rounding_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const StoredMatrix a_shape = stored(trans_a, m, k, lda), b_shape = stored(trans_b, k, n, ldb);
  const Bf16Operand a16 = bf16_operand(a, a_shape, t_packed.a_bf16), b16 = bf16_operand(b, b_shape, t_packed.b_bf16);
  const Bf16Matmul& matmul = bf16_matmul(trans_a, trans_b, alpha, beta);
  if (matmul.native) return execute(matmul, m, n, k, a16.data, a16.ld, b16.data, b16.ld, c, ldc);
  // no oneDNN bf16 kernel for this CPU (AVX2) or layout: the bf16 values, widened, on the float backend
  widened_product(trans_a, trans_b, m, n, k, alpha, a16.data, a16.ld, b16.data, b16.ld, beta, c, ldc);
}

}  // namespace

void set_gemm_backend(GemmBackend backend) { g_backend = backend; }
GemmBackend gemm_backend() { return g_backend; }

const char* gemm_backend_name(GemmBackend backend) {
  return backend == GemmBackend::onednn ? "onednn" : "openblas";
}

GemmBackend gemm_backend_from_name(const std::string& name, const char* option) {
  for (const GemmBackend backend : {GemmBackend::onednn, GemmBackend::openblas})
    if (name == gemm_backend_name(backend)) return backend;
  fail(option, " ", name, ": expected onednn or openblas");
}

void set_matmul_precision(MatmulPrecision precision) { g_precision = precision; }
MatmulPrecision matmul_precision() { return g_precision; }

const char* matmul_precision_name(MatmulPrecision precision) {
  return precision == MatmulPrecision::fp32 ? "fp32" : "bf16";
}

MatmulPrecision matmul_precision_from_name(const std::string& name, const char* option) {
  for (const MatmulPrecision precision : {MatmulPrecision::fp32, MatmulPrecision::bf16})
    if (name == matmul_precision_name(precision)) return precision;
  fail(option, " ", name, ": expected fp32 or bf16");
}

RegisteredBf16Copy::RegisteredBf16Copy(const float* source, const bf16* copy, int64_t size) : copy_(copy) {
  TRILLION_CHECK(size > 0, "a registered bf16 copy needs elements, got ", size);
  TRILLION_CHECK(!omp_in_parallel(), "bf16 copies are registered outside parallel regions");
  const auto begin = reinterpret_cast<uintptr_t>(source), end = reinterpret_cast<uintptr_t>(source + size);
  for (const RegisteredCopy& r : registered_copies())
    TRILLION_CHECK(end <= r.begin || begin >= r.end, "bf16 copies of overlapping buffers");
  registered_copies().push_back({begin, end, copy});
}

RegisteredBf16Copy::~RegisteredBf16Copy() {
  std::erase_if(registered_copies(), [&](const RegisteredCopy& r) { return r.copy == copy_; });
}

Bf16OperandCopy::Bf16OperandCopy(const float* source, int64_t size)
    : source_(source), size_(size), copy_(size), registration_(source, copy_.data(), size) {
  refresh();
}

void Bf16OperandCopy::refresh() { refresh(0, size_); }

void Bf16OperandCopy::refresh(int64_t begin, int64_t end) {
  TRILLION_CHECK(0 <= begin && begin <= end && end <= size_, "refresh of ", begin, "..", end, " of ", size_);
  to_bf16_threaded(source_ + begin, copy_.data() + begin, end - begin);
}

bool bf16_matmul_is_native() {
  static const bool native = bf16_matmul(false, false, 1.0f, 0.0f).native;
  return native;
}

int64_t bf16_matmul_primitives_on_this_thread() { return int64_t(thread_matmuls().size()); }

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc, Operands operands) {
  PhaseScope scope(Phase::gemm, /*team_scope=*/!omp_in_parallel());  // OpenBLAS runs on the team
  TRILLION_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm sizes m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  // Stored shapes: a is [m, k] (or [k, m] transposed), b is [k, n] (or [n, k]), c is [m, n].
  TRILLION_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, "gemm strides lda=", lda,
                 " ldb=", ldb, " ldc=", ldc, " for m=", m, " n=", n, " k=", k);
  // cblas takes blasint (32-bit in Debian's OpenBLAS): every size and stride must fit before the casts.
  constexpr int64_t blas_max = std::numeric_limits<blasint>::max();
  TRILLION_CHECK(m <= blas_max && n <= blas_max && k <= blas_max && lda <= blas_max && ldb <= blas_max &&
                     ldc <= blas_max,
                 "gemm m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc,
                 " exceed the BLAS integer limit ", blas_max);
  if (k == 0) return scale_rows(m, n, beta, c, ldc);
  [[maybe_unused]] const LibraryOnCallingThread one_thread_under_tsan;
  if constexpr (std::is_same_v<T, float>) {
    if (operands == Operands::as_set && g_precision == MatmulPrecision::bf16)
      return gemm_rounding_operands(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (g_backend == GemmBackend::onednn)
      return onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  PhaseScope scope(Phase::gemm, /*team_scope=*/!omp_in_parallel());
  TRILLION_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_bf16 sizes m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  TRILLION_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, "gemm_bf16 strides lda=", lda,
                 " ldb=", ldb, " ldc=", ldc, " for m=", m, " n=", n, " k=", k);
  if (k == 0) return scale_rows(m, n, beta, c, ldc);
  [[maybe_unused]] const LibraryOnCallingThread one_thread_under_tsan;
  const Bf16Matmul& matmul = bf16_matmul(trans_a, trans_b, alpha, beta);
  if (matmul.native) return execute(matmul, m, n, k, a, lda, b, ldb, c, ldc);
  widened_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, int64_t rows, int64_t in, int64_t out, Operands operands) {
  // y[rows, out] = x[rows, in] · w[out, in]ᵀ
  gemm<T>(false, true, rows, out, in, T(1), x, in, w, in, T(0), y, out, operands);
}

template <class T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx, Operands operands) {
  // dx[rows, in] = dy[rows, out] · w[out, in]  (beta 1 accumulates)
  if (dx != nullptr)
    gemm<T>(false, false, rows, in, out, T(1), dy, out, w, in, accumulate_dx ? T(1) : T(0), dx, in, operands);
  // dw[out, in] += dy[rows, out]ᵀ · x[rows, in]
  if (dw != nullptr) gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dw, in, operands);
}

#define TRILLION_INSTANTIATE_GEMM(T)                                                                          \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
                        int64_t, Operands);                                                                    \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, Operands);                \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, Operands);
TRILLION_INSTANTIATE_GEMM(float)
TRILLION_INSTANTIATE_GEMM(double)
#undef TRILLION_INSTANTIATE_GEMM

}  // namespace trillion
