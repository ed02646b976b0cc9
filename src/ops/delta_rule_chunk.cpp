// The gated delta rule in chunked form: the forward here, the backward in
// delta_rule_chunk_backward.cpp, the per-chunk machinery in delta_rule_chunk_work.h (see delta_rule.h
// for the math, layouts
// and segments; the recurrent form in delta_rule.cpp is the oracle of the tests).
// A work item is one (segment, head) pair; its chunks of kDeltaRuleChunk tokens run in order on a
// state S[K, V] held in per-thread scratch allocated before the parallel region, so every sum runs in
// a fixed order inside one item and results do not depend on the thread count.
// Inside a chunk the products are GEMMs (cblas, single-threaded inside the OpenMP region) read
// straight from the strided token-major inputs (row stride H·K or H·V).
// Decay numerics: Γ_tj = exp(G_t − G_j) is never formed as exp(G_t) · exp(−G_j) across the chunk.
// Per head it is C² pairwise exps per chunk and K Kᵀ, Q Kᵀ stay GEMMs. Per key channel (fla's scheme)
// the chunk is cut into sub-chunks of kSub = 16: pairs inside a sub-chunk use pairwise differences
// per channel (4 · 136 · K exps per chunk), pairs across sub-chunks factor Γ_tj = exp(G_t − G_r) ·
// exp(G_r − G_j) through r, the first token of t's sub-chunk (both factors ≤ 1, so no overflow; an
// underflow only drops terms below the smallest normal), which makes those blocks GEMMs at the cost
// of (64 + 96) · K more exps per chunk; backward uses the same split.
// Every exp runs in batches through the vectorized exp (ops/vector_exp.h): differences are written
// to an array, then exponentiated in place. The intra-sub-chunk Γ (and per head the C² Γ) and the
// column factors Ecol of every sub-chunk stay in ChunkWork, so the backward, right after its
// prepare_chunk, reuses them instead of recomputing exps; the intra-sub-chunk dot products use
// lane-blocked accumulators (fixed order) so their loops over K vectorize.
// Backward: a first pass keeps the state at the start of every chunk; then, chunks from the last,
// it recomputes the chunk's W, U, V_new and runs the reverse recursion for dS, with the gradient
// through Tm = (I + L)⁻¹ as dL = −Tmᵀ dTm Tmᵀ = −(dVb Uᵀ + dKb Wᵀ) (strictly lower), and a reverse
// cumulative sum of dG for dg.
#include "ops/delta_rule_chunk_work.h"

namespace trillion {

using namespace delta_rule_detail;  // this file's own machinery (delta_rule_chunk_work.h)

int64_t delta_rule_chunk_forward_workspace_bytes(int64_t key_dim, int64_t value_dim, int64_t element_bytes,
                                                 int threads) {
  return threads * forward_per_thread(key_dim, value_dim) * element_bytes;
}

template <class T>
void delta_rule_chunk_forward(T* o, T* s_final, const T* q, const T* k, const T* v, const T* g, const T* beta,
                              const T* s0, const int32_t* cu_seqlens, const DeltaRuleSizes& sizes) {
  check_and_longest_segment(cu_seqlens, sizes);
  const int64_t K = sizes.key_dim, V = sizes.value_dim, KV = K * V, H = sizes.heads;
  const int64_t segments = segment_count(cu_seqlens, sizes);
  const int64_t per_thread = forward_per_thread(K, V);  // state [K, V], then the chunk work arrays
  Buffer<T> scratch(num_threads() * per_thread);
  parallel_for(segments * H, [&](int64_t item) {
    const int64_t n = item / H, h = item % H;
    const Segment seg = segment_of(n, cu_seqlens, sizes);
    T* S = scratch.data() + omp_get_thread_num() * per_thread;  // [K, V]
    const ChunkWork<T> w(S + KV, K, V);
    load_state(S, s0, n, h, sizes);
    for (int64_t begin = seg.begin; begin < seg.end; begin += C) {
      const int64_t L = std::min(C, seg.end - begin);
      const ChunkInputs<T> in = chunk_inputs(q, k, v, g, beta, sizes, seg.row, begin, L, h);
      prepare_chunk(w, in, sizes);
      chunk_values(w, S, L, K, V);
      // O = (Q ⊙ E) S + P Vn, written into o's rows (stride H·V).
      T* oc = o + ((seg.row * sizes.seq_len + begin) * H + h) * V;  // [L, V]
      gemm<T>(false, false, L, V, K, T(1), w.QE, K, S, V, T(0), oc, H * V);
      gemm<T>(false, false, L, V, L, T(1), w.P, C, w.Vn, V, T(1), oc, H * V);
      advance_state(w, S, L, K, V);
    }
    if (s_final != nullptr) std::memcpy(s_final + (n * H + h) * KV, S, KV * sizeof(T));
  });
}

#define TRILLION_INSTANTIATE(T)                                                                                 \
  template void delta_rule_chunk_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                            const int32_t*, const DeltaRuleSizes&);
TRILLION_INSTANTIATE(float)
TRILLION_INSTANTIATE(double)
#undef TRILLION_INSTANTIATE

}  // namespace trillion
