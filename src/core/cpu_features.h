// The instruction sets this build was compiled for (the compiler's predefined macros: -march=native
// or the portable -mavx2 -mfma baseline) that the CPU running it lacks, so `trillion` can refuse to
// start with a message naming them instead of dying of SIGILL somewhere later. The vector kernels
// choose their own instruction set at run time (ops/vector_exp.h) and are not counted here.
#pragma once

#include <string>
#include <vector>

namespace trillion {

// Empty when the CPU runs everything the build uses.
std::vector<std::string> missing_cpu_features();

}  // namespace trillion
