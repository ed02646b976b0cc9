// The gated delta rule (ops/delta_rule.h: Gated DeltaNet and Kimi Delta Attention) over a sequence
// split by context parallelism (parallel/context_parallel.h), by state passing: no rank waits for
// the earlier ranks' tokens to be computed (docs/architecture.md, "Context parallelism").
//
// The state after a span of tokens is affine in the state before it: S_end = P S_begin + S⁰, with
// P [K, K] the span's transition (decays and (I − β k kᵀ) factors, left-multiplying) and S⁰ [K, V]
// the state the span reaches from zero; and each output o_t = o⁰_t + S_beginᵀ o'_t, with
// o'_t = P_{≤t}ᵀ q_t [K]. The chunked kernel gives all of it:
//   - the span from a zero state gives o⁰ and S⁰;
//   - the span with v = 0 from the state I_K gives o' (its outputs) and P (its final state).
// Each rank runs both for its two chunks at once, the ranks exchange only the chunks' summaries
// (P, S⁰) per head, every rank composes the incoming states S_in(c + 1) = P_c S_in(c) + S⁰_c of the
// 2 · cp chunks in order, and corrects its outputs by S_inᵀ o'.
//
// The backward is symmetric: each chunk's own dS_in = Σ_t o'_t d_o_tᵀ is exchanged, every rank runs
// the chain backward, g(c) = dS_in(c) + P_cᵀ g(c + 1), giving each chunk the gradient of its final
// states, dS⁰_c = g(c + 1) and dP_c = g(c + 1) S_in(c)ᵀ, and the kernel's backward of both runs
// (the second with d_o' = S_in d_o) adds up to the gradients of q, k, v, g and β.
//
// Document masks (doc_start [B, local], global positions): a document starting inside a chunk cuts
// it into segments, and only the chunk's first segment continues the earlier chunks' state (and not
// when a document starts at the chunk's first token). The later segments start from zero in both
// runs, so a chunk whose last segment does not continue has P = 0 and passes on its own state only.
#pragma once

#include <cstdint>

#include "ops/delta_rule.h"
#include "parallel/context_parallel.h"

namespace trillion {

// Elements of the chunks' summaries: [B, 2 · cp, H, K · K + K · V] (each chunk's P, then S⁰).
int64_t context_delta_rule_summary_count(const ContextSplit& split, const DeltaRuleSizes& local);

// What the forward and the backward (the summaries formed again, as the model's layers run it) cost
// `rank` in a step (the memory plan's ContextPlan), without document masks (each document starting
// inside a chunk adds a segment's states to several buffers): the buffers at their peak with the
// kernel's temporaries, and the traffic below.
ContextCost context_delta_rule_cost(const ContextSplit& split, int rank, const DeltaRuleSizes& local, int threads,
                                    int64_t element_bytes);

// Training FLOPs per token and head beyond the kernel's own 3 · delta_rule_chunk_flops_per_token
// (ops/delta_rule.h) when the model's layers run it split: the forward runs the kernel twice (the
// values V from zero, and K values from the state I), the backward forms both runs again and runs
// both backwards, and the correction o += S_inᵀ o' costs K · V multiply-adds a token in the forward
// and twice that in the backward. The chain over the 2 · cp chunks' summaries is left out (K · K · V
// a chunk).
double context_delta_rule_flops_per_token(int64_t key_dim, int64_t value_dim);

// The bytes a rank receives: forward the other ranks' summaries of their chunks, backward their
// chunks' dS_in [K, V] per head, and the summaries again when the backward forms them again.
ContextPassTraffic context_delta_rule_traffic(const ContextSplit& split, const DeltaRuleSizes& local,
                                                   int64_t element_bytes, bool summaries_formed_again = false);

// o [B, local, H, V] (=) and every chunk's summaries (for the backward) from this rank's q, k
// [B, local, H, K], v [B, local, H, V], g [B, local, H] or [B, local, H, K], beta [B, local, H];
// local.seq_len = split.local_len(rank), local.batch = B (no cu_seqlens: the split's chunks and
// doc_start make the segments). The chunked kernel runs inside.
template <class T>
void context_delta_rule_forward(T* o, T* summaries, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                const int32_t* doc_start, const DeltaRuleSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic);

// Its backward: dq, dk, dv, dg, dbeta written (=) from d_o and the forward's inputs and summaries
// (null: formed again here, by both runs of the forward and their gather).
template <class T>
void context_delta_rule_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* d_o, const T* q, const T* k, const T* v,
                                 const T* g, const T* beta, const T* summaries, const int32_t* doc_start,
                                 const DeltaRuleSizes& local, const ContextSplit& split, const ProcessGroup& group,
                                 ContextTraffic* traffic);

}  // namespace trillion
