// The build's instruction sets checked against the CPU (see the header).
#include "core/cpu_features.h"

namespace trillion {

std::vector<std::string> missing_cpu_features() {
  __builtin_cpu_init();
  std::vector<std::string> missing;
  const auto need = [&](bool supported, const char* name) {
    if (!supported) missing.emplace_back(name);
  };
#if defined(__AVX2__)
  need(__builtin_cpu_supports("avx2"), "avx2");
#endif
#if defined(__FMA__)
  need(__builtin_cpu_supports("fma"), "fma");
#endif
#if defined(__BMI2__)
  need(__builtin_cpu_supports("bmi2"), "bmi2");
#endif
#if defined(__AVX512F__)
  need(__builtin_cpu_supports("avx512f"), "avx512f");
#endif
#if defined(__AVX512VL__)
  need(__builtin_cpu_supports("avx512vl"), "avx512vl");
#endif
#if defined(__AVX512BW__)
  need(__builtin_cpu_supports("avx512bw"), "avx512bw");
#endif
#if defined(__AVX512DQ__)
  need(__builtin_cpu_supports("avx512dq"), "avx512dq");
#endif
#if defined(__AVX512CD__)
  need(__builtin_cpu_supports("avx512cd"), "avx512cd");
#endif
#if defined(__AVX512VNNI__)
  need(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
#endif
#if defined(__AVX512IFMA__)
  need(__builtin_cpu_supports("avx512ifma"), "avx512ifma");
#endif
#if defined(__AVX512VBMI__)
  need(__builtin_cpu_supports("avx512vbmi"), "avx512vbmi");
#endif
#if defined(__AVX512BF16__)
  need(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
#endif
  return missing;
}

}  // namespace trillion
