// Counter-based random numbers: every value is a pure function of (seed, stream, counter), so
// initialization depends on (seed, parameter name, element index) only and not on sharding,
// thread count or the order in which tensors are filled. The mixer is SplitMix64's finalizer
// applied to a keyed counter (a bijection of 64 bits), good enough for initialization, sampling
// and data shuffling.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace trillion {

// FNV-1a 64-bit hash of a name (stable across platforms and runs).
inline uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : key_(mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ stream)) {}
  CounterRng(uint64_t seed, std::string_view stream_name) : CounterRng(seed, hash_name(stream_name)) {}

  uint64_t bits(uint64_t counter) const { return mix64(key_ ^ mix64(counter * 0x9e3779b97f4a7c15ull + 1)); }
  // Uniform in the open interval (0, 1), 53 bits.
  double uniform(uint64_t counter) const { return ((bits(counter) >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal (Box-Muller on two uniforms drawn at counters 2c and 2c+1).
  double normal(uint64_t counter) const {
    const double u1 = uniform(2 * counter), u2 = uniform(2 * counter + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
};

}  // namespace trillion
