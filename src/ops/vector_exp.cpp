// The start-up choice of the vector kernels' instruction set (see ops/vector_exp.h).
#include "ops/vector_exp.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace trillion {
namespace {

VectorIsa isa_at_startup() {
  const char* forced = std::getenv("TRILLION_ISA");
  if (forced != nullptr && *forced != '\0') {
    const std::string name = forced;
    VectorIsa isa;
    if (name == "avx2") {
      isa = VectorIsa::avx2;
    } else if (name == "avx512") {
      isa = VectorIsa::avx512;
    } else {
      fail("TRILLION_ISA=", name, ": expected avx2 or avx512");
    }
    if (!cpu_supports(isa)) fail("TRILLION_ISA=", name, ": this CPU does not support ", vector_isa_name(isa));
    return isa;
  }
  if (cpu_supports(VectorIsa::avx512)) return VectorIsa::avx512;
  if (cpu_supports(VectorIsa::avx2)) return VectorIsa::avx2;
  fail("this CPU lacks AVX2 and FMA, which the engine's vector kernels need (at least x86-64-v3)");
}

const VectorKernels& kernels_of(VectorIsa isa) {
  return isa == VectorIsa::avx512 ? avx512_vector_kernels() : avx2_vector_kernels();
}

VectorIsa startup_isa() {
  static const VectorIsa isa = isa_at_startup();
  return isa;
}

std::atomic<int> g_override{-1};  // a VectorIsa set by set_vector_isa, or −1

}  // namespace

const char* vector_isa_name(VectorIsa isa) { return isa == VectorIsa::avx512 ? "avx512" : "avx2"; }

bool cpu_supports(VectorIsa isa) {
  __builtin_cpu_init();
  if (isa == VectorIsa::avx512) return __builtin_cpu_supports("avx512f");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

VectorIsa vector_isa() {
  const int forced = g_override.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<VectorIsa>(forced) : startup_isa();
}

void set_vector_isa(VectorIsa isa) {
  if (!cpu_supports(isa)) fail("set_vector_isa: this CPU does not support ", vector_isa_name(isa));
  g_override.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const VectorKernels& vector_kernels() {
  static const VectorKernels& chosen = kernels_of(startup_isa());
  const int forced = g_override.load(std::memory_order_relaxed);
  return forced >= 0 ? kernels_of(static_cast<VectorIsa>(forced)) : chosen;
}

}  // namespace trillion
