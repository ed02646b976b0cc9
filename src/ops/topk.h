// Deterministic top-k over the rows of a score matrix: the k largest scores of each row, ordered by
// score descending, then by index ascending (docs/architecture.md, "Determinism": every top-k breaks
// ties this way), so the result does not depend on the thread count or on the sorting algorithm. Used
// by the MoE router; the sparse-attention indexer's streamed selection (ops/indexer_select.h) ranks
// the same way. −∞ scores (masked entries) are allowed and rank
// last; NaN scores rank first (above +∞, as torch.topk ranks them), so a NaN upstream is selected
// and flows on into the step's loss, where the trainer's numeric guard names it (train/
// numeric_guard.h). Saves nothing; has no backward (a selection).
#pragma once

#include <cstdint>

namespace trillion {

// indices[rows, k] ← positions of the k largest entries of each row of scores[rows, n]; 1 ≤ k ≤ n.
template <class T>
void topk_rows(int32_t* indices, const T* scores, int64_t rows, int64_t n, int64_t k);
// The bytes of topk_rows' temporaries (per-thread positions [threads, n] of int32 when k is beyond
// the insertion kernel's), for the memory plan.
int64_t topk_rows_workspace_bytes(int64_t n, int64_t k, int threads);

}  // namespace trillion
