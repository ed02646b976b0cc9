// <immintrin.h>, included once for every kernel that uses x86 vector intrinsics.
#pragma once

// GCC 12 flags the undefined pass-through operand inside its own AVX-512 intrinsics (GCC bug
// 105593); the warning is a false positive, silenced for the header's own lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
