// The gated delta rule across a context-parallel split by state passing. See context_delta_rule.h.
#include "parallel/context_delta_rule.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "ops/gemm.h"

namespace trillion {
namespace {

// This rank's tokens as the kernel's packed segments (batch 1, B · local tokens): every span of
// every sequence, cut again where a document starts inside it.
struct Segments {
  std::vector<int32_t> cu_seqlens;   // [segments + 1]
  std::vector<int64_t> first, last;  // [B, 2]: each span's first and last segment
  std::vector<uint8_t> continues;    // [B, 2]: its first segment continues the earlier chunks' state
  Segments(const ContextSplit& split, int rank, int64_t batch, const int32_t* doc_start) {
    const int64_t len = split.local_len(rank);
    cu_seqlens.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
      int64_t base = b * len;  // the span's first packed token
      for (const ContextSplit::Span& span : split.spans(rank)) {
        first.push_back(int64_t(cu_seqlens.size()) - 1);
        continues.push_back(span.begin > 0 && (doc_start == nullptr || doc_start[base] < span.begin));
        for (int64_t j = 1; j < span.size(); ++j)
          if (doc_start != nullptr && doc_start[base + j] == span.begin + j) cu_seqlens.push_back(int32_t(base + j));
        cu_seqlens.push_back(int32_t(base + span.size()));
        last.push_back(int64_t(cu_seqlens.size()) - 2);
        base += span.size();
      }
    }
  }
  int64_t count() const { return int64_t(cu_seqlens.size()) - 1; }
};

// The dimensions and index arithmetic of one call.
struct Geometry {
  const ContextSplit& split;
  int rank;
  int64_t batch, len, heads, kd, vd, chunks;
  Geometry(const ContextSplit& split, const ProcessGroup& group, const DeltaRuleSizes& local)
      : split(split),
        rank(group.rank()),
        batch(local.batch),
        len(local.seq_len),
        heads(local.heads),
        kd(local.key_dim),
        vd(local.value_dim),
        chunks(2 * int64_t(split.ranks())) {
    TRILLION_CHECK(group.size() == split.ranks(), "context split over ", split.ranks(), " ranks, group of ",
                   group.size());
    TRILLION_CHECK(local.seq_len == split.local_len(rank), "context delta rule: rank ", rank, " holds ",
                   split.local_len(rank), " tokens per sequence, sizes give ", local.seq_len);
  }
  int64_t chunk_of(int64_t s) const { return s == 0 ? rank : chunks - 1 - rank; }  // span s of this rank
  int64_t summary() const { return kd * kd + kd * vd; }                            // P, then S⁰
  // The kernel's sizes over the packed tokens, with value dim `values`.
  DeltaRuleSizes packed(const DeltaRuleSizes& local, const Segments& seg, int64_t values) const {
    DeltaRuleSizes p = local;
    p.batch = 1;
    p.seq_len = batch * len;
    p.value_dim = values;
    p.num_segments = seg.count();
    return p;
  }
};

// s_in [B, chunks, H, K, V]: the state entering every chunk, from the summaries in chunk order.
template <class T>
Buffer<T> incoming_states(const T* summaries, const Geometry& geo) {
  const int64_t kk = geo.kd * geo.kd, kv = geo.kd * geo.vd;
  Buffer<T> s_in(geo.batch * geo.chunks * geo.heads * kv);  // chunk 0's stays zero
  for (int64_t b = 0; b < geo.batch; ++b)
    for (int64_t c = 0; c + 1 < geo.chunks; ++c)
      for (int64_t h = 0; h < geo.heads; ++h) {
        const T* sum = summaries + ((b * geo.chunks + c) * geo.heads + h) * geo.summary();  // P [K, K], S⁰ [K, V]
        T* next = s_in.data() + ((b * geo.chunks + c + 1) * geo.heads + h) * kv;
        std::copy_n(sum + kk, kv, next);
        gemm(false, false, geo.kd, geo.vd, geo.kd, T(1), sum, geo.kd,
             s_in.data() + ((b * geo.chunks + c) * geo.heads + h) * kv, geo.vd, T(1), next, geo.vd, Operands::fp32);
      }
  return s_in;
}

// The second run's initial states: I_K for each span's first segment that continues, else zero.
template <class T>
Buffer<T> identity_states(const Segments& seg, const Geometry& geo) {
  Buffer<T> s0(seg.count() * geo.heads * geo.kd * geo.kd);  // [segments, H, K, K]
  for (size_t i = 0; i < seg.first.size(); ++i)
    if (seg.continues[i])
      for (int64_t h = 0; h < geo.heads; ++h)
        for (int64_t j = 0; j < geo.kd; ++j) s0[((seg.first[i] * geo.heads + h) * geo.kd + j) * geo.kd + j] = T(1);
  return s0;
}

// Calls fn(span index i = b · 2 + s, chunk, first token, end token) for each span whose first segment
// continues: the tokens of that segment.
template <class Fn>
void for_each_continued(const Segments& seg, const Geometry& geo, const Fn& fn) {
  for (int64_t i = 0; i < int64_t(seg.first.size()); ++i)
    if (seg.continues[i]) fn(i, geo.chunk_of(i % 2), seg.cu_seqlens[seg.first[i]], seg.cu_seqlens[seg.first[i] + 1]);
}

// The forward's two runs over this rank's spans: from zero into o⁰ [tokens, H, V], and with v = 0 from
// I_K, whose outputs o' [tokens, H, K] it returns; every chunk's summary (P, S⁰) into summaries, this
// rank's from its spans' last segments and the others' gathered.
template <class T>
Buffer<T> summarized_runs(T* o_zero, T* summaries, const T* q, const T* k, const T* v, const T* g, const T* beta,
                          const T* zeros, const T* s0, const Segments& seg, const Geometry& geo,
                          const DeltaRuleSizes& local, const ProcessGroup& group, ContextTraffic* traffic) {
  const int64_t tokens = geo.batch * geo.len, H = geo.heads, K = geo.kd, V = geo.vd, kk = K * K, kv = K * V;
  Buffer<T> s_zero(seg.count() * H * kv);  // [segments, H, K, V]
  delta_rule_chunk_forward(o_zero, s_zero.data(), q, k, v, g, beta, static_cast<const T*>(nullptr),
                           seg.cu_seqlens.data(), geo.packed(local, seg, V));
  Buffer<T> o_id(tokens * H * K), s_id(seg.count() * H * kk);  // [tokens, H, K], [segments, H, K, K]
  delta_rule_chunk_forward(o_id.data(), s_id.data(), q, k, zeros, g, beta, s0, seg.cu_seqlens.data(),
                           geo.packed(local, seg, K));
  std::fill_n(summaries, context_delta_rule_summary_count(geo.split, local), T(0));
  for (int64_t i = 0; i < int64_t(seg.last.size()); ++i)
    for (int64_t h = 0; h < H; ++h) {
      T* sum = summaries + (((i / 2) * geo.chunks + geo.chunk_of(i % 2)) * H + h) * geo.summary();
      std::copy_n(s_id.data() + (seg.last[i] * H + h) * kk, kk, sum);
      std::copy_n(s_zero.data() + (seg.last[i] * H + h) * kv, kv, sum + kk);
    }
  gather_chunk_slots(summaries, geo.batch, H * geo.summary(), geo.split, group, traffic);
  return o_id;
}

}  // namespace

int64_t context_delta_rule_summary_count(const ContextSplit& split, const DeltaRuleSizes& local) {
  return local.batch * 2 * split.ranks() * local.heads * local.key_dim * (local.key_dim + local.value_dim);
}

double context_delta_rule_flops_per_token(int64_t key_dim, int64_t value_dim) {
  const double values_run = delta_rule_chunk_flops_per_token(key_dim, value_dim);
  const double transition_run = delta_rule_chunk_flops_per_token(key_dim, key_dim);
  const double correction = 3.0 * 2.0 * double(key_dim * value_dim);
  return 4.0 * (values_run + transition_run) + correction - 3.0 * values_run;
}

ContextPassTraffic context_delta_rule_traffic(const ContextSplit& split, const DeltaRuleSizes& local,
                                                   int64_t element_bytes, bool summaries_formed_again) {
  const int64_t others = int64_t(split.ranks() - 1) * local.batch * 2 * local.heads * element_bytes;
  const int64_t summaries = others * local.key_dim * (local.key_dim + local.value_dim);
  return {{summaries, 0}, {others * local.key_dim * local.value_dim + (summaries_formed_again ? summaries : 0), 0}};
}

// In the order context_delta_rule_forward and _backward allocate (S segments, one per span without
// documents; every tensor of T):
//   forward   the summaries (ContextParallel's), zeros, s0; in summarized_runs s_zero with the first
//             run's temporaries, then o_id and s_id with the second's; then o_id and s_in;
//   backward  zeros, s0, the summaries formed again, o_zero, and summarized_runs as above; then
//             o_id, s_in, d_o_id, ds_in, ds_zero, ds_id and the chain's two states with the first
//             kernel backward's temporaries, then also dq_id … dbeta_id with the second's.
ContextCost context_delta_rule_cost(const ContextSplit& split, int rank, const DeltaRuleSizes& local, int threads,
                                    int64_t element_bytes) {
  const int64_t e = element_bytes, B = local.batch, H = local.heads, K = local.key_dim, V = local.value_dim;
  const int64_t tokens = B * split.local_len(rank), S = 2 * B, chunks = 2 * int64_t(split.ranks());
  const std::array<ContextSplit::Span, 2> spans = split.spans(rank);
  const int64_t longest = std::max(spans[0].size(), spans[1].size());
  const auto forward_kernel = [&](int64_t values) {
    return delta_rule_chunk_forward_workspace_bytes(K, values, e, threads);
  };
  const auto backward_kernel = [&](int64_t values) {
    return delta_rule_chunk_backward_workspace_bytes(K, values, longest, e, threads);
  };
  const int64_t summaries = context_delta_rule_summary_count(split, local) * e;
  const int64_t zeros = tokens * H * K * e, s0 = S * H * K * K * e, s_zero = S * H * K * V * e;
  const int64_t o_id = tokens * H * K * e, s_id = S * H * K * K * e, s_in = B * chunks * H * K * V * e;
  const int64_t runs = s_zero + std::max(forward_kernel(V), o_id + s_id + forward_kernel(K));  // summarized_runs
  const int64_t forward = summaries + zeros + s0 + std::max(runs, o_id + s_in);
  const int64_t o_zero = tokens * H * V * e, d_o_id = tokens * H * K * e, ds_in = s_in;
  const int64_t ds_zero = S * H * K * V * e, ds_id = S * H * K * K * e, chain = 2 * H * K * V * e;
  const int64_t g_count = tokens * H * (local.decay == DeltaDecay::per_key_channel ? K : 1);
  const int64_t second = (3 * tokens * H * K + g_count + tokens * H) * e;  // dq_id, dk_id, dv_id, dg_id, dbeta_id
  const int64_t chained = zeros + s0 + summaries + o_id + s_in + d_o_id + ds_in + ds_zero + ds_id + chain;
  const int64_t backward = std::max(
      {zeros + s0 + summaries + o_zero + runs, chained + backward_kernel(V), chained + second + backward_kernel(K)});
  const ContextPassTraffic traffic = context_delta_rule_traffic(split, local, e, /*summaries_formed_again=*/true);
  return {.workspace = {.forward = forward, .backward = backward}, .received = traffic.both()};
}

template <class T>
void context_delta_rule_forward(T* o, T* summaries, const T* q, const T* k, const T* v, const T* g, const T* beta,
                                const int32_t* doc_start, const DeltaRuleSizes& local, const ContextSplit& split,
                                const ProcessGroup& group, ContextTraffic* traffic) {
  const Geometry geo(split, group, local);
  const Segments seg(split, geo.rank, geo.batch, doc_start);
  const int64_t H = geo.heads, K = geo.kd, V = geo.vd, kv = K * V;
  const Buffer<T> zeros(geo.batch * geo.len * H * K), s0 = identity_states<T>(seg, geo);  // [tokens, H, K]
  const Buffer<T> o_id =
      summarized_runs(o, summaries, q, k, v, g, beta, zeros.data(), s0.data(), seg, geo, local, group, traffic);
  // o += S_inᵀ o' over the tokens that continue the earlier chunks' state.
  const Buffer<T> s_in = incoming_states(summaries, geo);  // [B, chunks, H, K, V]
  for_each_continued(seg, geo, [&](int64_t i, int64_t chunk, int64_t t0, int64_t t1) {
    for (int64_t h = 0; h < H; ++h)
      gemm(false, false, t1 - t0, V, K, T(1), o_id.data() + t0 * H * K + h * K, H * K,
           s_in.data() + (((i / 2) * geo.chunks + chunk) * H + h) * kv, V, T(1), o + t0 * H * V + h * V, H * V,
           Operands::fp32);
  });
}

template <class T>
void context_delta_rule_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, const T* d_o, const T* q, const T* k, const T* v,
                                 const T* g, const T* beta, const T* summaries, const int32_t* doc_start,
                                 const DeltaRuleSizes& local, const ContextSplit& split, const ProcessGroup& group,
                                 ContextTraffic* traffic) {
  const Geometry geo(split, group, local);
  const Segments seg(split, geo.rank, geo.batch, doc_start);
  const int64_t tokens = geo.batch * geo.len, H = geo.heads, K = geo.kd, V = geo.vd, kk = K * K, kv = K * V;
  const Buffer<T> zeros(tokens * H * K), s0 = identity_states<T>(seg, geo);  // [tokens, H, K]
  // o' again (and without the forward's summaries, those formed again: both runs and their gather).
  Buffer<T> o_id, formed;  // [tokens, H, K]; the summaries when formed here
  if (summaries == nullptr) {
    formed = Buffer<T>(context_delta_rule_summary_count(split, local));
    Buffer<T> o_zero(tokens * H * V);  // [tokens, H, V] not needed again
    o_id = summarized_runs(o_zero.data(), formed.data(), q, k, v, g, beta, zeros.data(), s0.data(), seg, geo, local,
                           group, traffic);
    summaries = formed.data();
  } else {
    o_id = Buffer<T>(tokens * H * K);
    delta_rule_chunk_forward(o_id.data(), static_cast<T*>(nullptr), q, k, zeros.data(), g, beta, s0.data(),
                             seg.cu_seqlens.data(), geo.packed(local, seg, K));
  }
  const Buffer<T> s_in = incoming_states(summaries, geo);  // [B, chunks, H, K, V]
  // Each continued chunk's own dS_in = Σ_t o'_t d_o_tᵀ, and d_o' = S_in d_o.
  Buffer<T> d_o_id(tokens * H * K);                  // [tokens, H, K]
  Buffer<T> ds_in(geo.batch * geo.chunks * H * kv);  // [B, chunks, H, K, V]
  for_each_continued(seg, geo, [&](int64_t i, int64_t chunk, int64_t t0, int64_t t1) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = (((i / 2) * geo.chunks + chunk) * H + h) * kv;
      gemm(true, false, K, V, t1 - t0, T(1), o_id.data() + t0 * H * K + h * K, H * K, d_o + t0 * H * V + h * V, H * V,
           T(0), ds_in.data() + at, V, Operands::fp32);
      gemm(false, true, t1 - t0, K, V, T(1), d_o + t0 * H * V + h * V, H * V, s_in.data() + at, V, T(0),
           d_o_id.data() + t0 * H * K + h * K, H * K, Operands::fp32);
    }
  });
  gather_chunk_slots(ds_in.data(), geo.batch, H * kv, split, group, traffic);
  // The chain backward: g(c) = dS_in(c) + P_cᵀ g(c + 1); this rank's spans' final states get
  // dS⁰_c = g(c + 1) and dP_c = g(c + 1) S_in(c)ᵀ.
  Buffer<T> ds_zero(seg.count() * H * kv), ds_id(seg.count() * H * kk);  // [segments, H, K, V / K]
  Buffer<T> later(H * kv), current(H * kv);                              // g(c + 1), g(c): [H, K, V]
  for (int64_t b = 0; b < geo.batch; ++b) {
    std::fill_n(later.data(), H * kv, T(0));
    for (int64_t c = geo.chunks - 1; c >= 0; --c) {
      for (int64_t s = 0; s < 2; ++s)
        if (geo.chunk_of(s) == c)
          for (int64_t h = 0; h < H; ++h) {
            const int64_t last = seg.last[b * 2 + s];
            std::copy_n(later.data() + h * kv, kv, ds_zero.data() + (last * H + h) * kv);
            gemm(false, true, K, K, V, T(1), later.data() + h * kv, V,
                 s_in.data() + ((b * geo.chunks + c) * H + h) * kv, V, T(0), ds_id.data() + (last * H + h) * kk, K,
                 Operands::fp32);
          }
      for (int64_t h = 0; h < H; ++h) {
        const T* p = summaries + ((b * geo.chunks + c) * H + h) * geo.summary();  // P_c [K, K]
        std::copy_n(ds_in.data() + ((b * geo.chunks + c) * H + h) * kv, kv, current.data() + h * kv);
        gemm(true, false, K, V, K, T(1), p, K, later.data() + h * kv, V, T(1), current.data() + h * kv, V,
             Operands::fp32);
      }
      std::swap(later, current);
    }
  }
  // The kernel's backward of both runs; the second's dv is of the zeros, and dropped.
  delta_rule_chunk_backward(dq, dk, dv, dg, dbeta, static_cast<T*>(nullptr), d_o, ds_zero.data(), q, k, v, g, beta,
                            static_cast<const T*>(nullptr), seg.cu_seqlens.data(), geo.packed(local, seg, V));
  const int64_t g_count = tokens * H * (local.decay == DeltaDecay::per_key_channel ? K : 1);
  Buffer<T> dq_id(tokens * H * K), dk_id(tokens * H * K), dv_id(tokens * H * K), dg_id(g_count), dbeta_id(tokens * H);
  delta_rule_chunk_backward(dq_id.data(), dk_id.data(), dv_id.data(), dg_id.data(), dbeta_id.data(),
                            static_cast<T*>(nullptr), d_o_id.data(), ds_id.data(), q, k, zeros.data(), g, beta,
                            s0.data(), seg.cu_seqlens.data(), geo.packed(local, seg, K));
  for (int64_t i = 0; i < tokens * H * K; ++i) dq[i] += dq_id[i], dk[i] += dk_id[i];
  for (int64_t i = 0; i < g_count; ++i) dg[i] += dg_id[i];
  for (int64_t i = 0; i < tokens * H; ++i) dbeta[i] += dbeta_id[i];
}

#define TRILLION_CONTEXT_DELTA_RULE(T)                                                                               \
  template void context_delta_rule_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,              \
                                              const int32_t*, const DeltaRuleSizes&, const ContextSplit&,            \
                                              const ProcessGroup&, ContextTraffic*);                                 \
  template void context_delta_rule_backward<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                               const T*, const T*, const int32_t*, const DeltaRuleSizes&,            \
                                               const ContextSplit&, const ProcessGroup&, ContextTraffic*);
TRILLION_CONTEXT_DELTA_RULE(float)
TRILLION_CONTEXT_DELTA_RULE(double)
#undef TRILLION_CONTEXT_DELTA_RULE

}  // namespace trillion
