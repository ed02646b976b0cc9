// The activation store: typed, shaped storage per (tag, layer), bytes counted and freed; the layer
// events applying recompute and swap policies (models against keep-all: tests/model/memory_policy_test.cpp).
#include "memory/activation_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "io/half_float.h"
#include "memory/save_policies.h"

namespace trillion {
namespace {

// Pages even the tests' small entries, and swaps to the test's temporary directory with every write
// waited for, so each swapped entry is read back.
void swap_every_entry_synchronously(ActivationStore& store) {
  store.set_paged_min_bytes(1);
  store.set_swap_directory(::testing::TempDir());
  store.set_swap_synchronous(true);
}

TEST(ActivationStore, SavesPerTagAndLayerAndCountsBytes) {
  ActivationStore store;
  const int64_t before = MemoryStats::current(Tier::fast);
  float* q0 = store.save<float>(ActivationTag::q, 0, 10);
  float* q1 = store.save<float>(ActivationTag::q, 1, 10);
  double* lse = store.save<double>(ActivationTag::attn_lse, 0, 3);
  EXPECT_NE(q0, q1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(q0[i], 0.0f);  // zero-filled
  q1[4] = 2.5f;
  lse[2] = -1.0;
  EXPECT_EQ(store.get<float>(ActivationTag::q, 1, 10)[4], 2.5f);
  EXPECT_EQ(store.get<double>(ActivationTag::attn_lse, 0, 3)[2], -1.0);
  EXPECT_TRUE(store.contains(ActivationTag::q, 1));
  EXPECT_FALSE(store.contains(ActivationTag::k, 0));
  EXPECT_EQ(store.num_saved(), 3);
  EXPECT_GE(store.bytes_in_use(), 2 * 40 + 24);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before + store.bytes_in_use());
  store.clear();
  EXPECT_EQ(store.num_saved(), 0);
  EXPECT_EQ(store.bytes_in_use(), 0);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);
  EXPECT_FALSE(store.contains(ActivationTag::q, 0));
}

TEST(ActivationStore, EntriesHaveTypeAndShape) {
  ActivationStore store;
  store.save<float>(ActivationTag::expert_act, 2, Shape{3, 5});
  EXPECT_EQ(store.shape(ActivationTag::expert_act, 2), (Shape{3, 5}));
  EXPECT_DEATH(store.get<int32_t>(ActivationTag::expert_act, 2, 15), "expert_act of layer 2 is float32, read as int32");
}

// recompute: dropped at end_forward (pages free, get refuses), refilled zeroed during recompute,
// kept entries handed a throwaway buffer; end_backward frees every byte.
TEST(ActivationStore, RecomputePolicyDropsAndRefills) {
  ActivationStore store;
  store.set_paged_min_bytes(1);
  store.set_policy(ActivationTag::mlp_act, SavePolicy::recompute);
  const int64_t before = MemoryStats::current(Tier::fast);
  float* act = store.save<float>(ActivationTag::mlp_act, 0, 1000);
  float* kept = store.save<float>(ActivationTag::mlp_gate, 0, 1000);
  act[7] = 1.5f;
  kept[7] = 2.5f;
  store.end_forward(0, TagSublayer::ffn);
  EXPECT_TRUE(store.dropped(ActivationTag::mlp_act, 0));
  EXPECT_TRUE(store.reruns(0, TagSublayer::ffn));
  EXPECT_FALSE(store.reruns(0, TagSublayer::mixer));
  EXPECT_DEATH(store.get<float>(ActivationTag::mlp_act, 0, 1000), "not resident \\(dropped for recompute\\)");
  store.begin_backward(0, TagSublayer::ffn);
  store.begin_recompute(0);
  float* refilled = store.save<float>(ActivationTag::mlp_act, 0, 1000);
  EXPECT_EQ(refilled[7], 0.0f);  // zero-filled again
  refilled[7] = 1.5f;
  float* throwaway = store.save<float>(ActivationTag::mlp_gate, 0, 1000);
  EXPECT_NE(throwaway, kept);
  throwaway[7] = -1.0f;
  EXPECT_DEATH(store.save<float>(ActivationTag::mlp_up, 0, 1000), "which its forward did not save");
  store.end_recompute();
  EXPECT_EQ(store.get<float>(ActivationTag::mlp_act, 0, 1000)[7], 1.5f);
  EXPECT_EQ(store.get<float>(ActivationTag::mlp_gate, 0, 1000)[7], 2.5f);  // never written twice
  EXPECT_EQ(store.counters().dropped_bytes, 4000);
  EXPECT_EQ(store.counters().recomputed_bytes, 4000);
  store.end_backward(0, TagSublayer::ffn);
  EXPECT_EQ(store.bytes_in_use(), 0);
  EXPECT_DEATH(store.get<float>(ActivationTag::mlp_act, 0, 1000), "not resident \\(consumed by its backward\\)");
  store.begin_backward(0, TagSublayer::mixer);
  store.end_backward(0, TagSublayer::mixer);
  EXPECT_FALSE(store.contains(ActivationTag::mlp_act, 0));
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);
  store.clear();
}

TEST(ActivationStore, SwapPolicyWritesAndReadsBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the swap engine runs a thread
  ActivationStore store;
  swap_every_entry_synchronously(store);
  store.set_policy(ActivationTag::expert_gate_up, SavePolicy::swap);
  for (int layer = 0; layer < 2; ++layer) {
    float* out = store.save<float>(ActivationTag::expert_gate_up, layer, 5000);
    for (int i = 0; i < 5000; ++i) out[i] = float(i + layer);
    store.end_forward(layer, TagSublayer::ffn);
  }
  EXPECT_EQ(MemoryStats::current(Tier::slow), 2 * PageArena::rounded(20000));  // the file's bytes
  EXPECT_DEATH(store.get<float>(ActivationTag::expert_gate_up, 1, 5000), "not resident \\(swapped out\\)");
  for (int layer = 1; layer >= 0; --layer) {
    store.begin_backward(layer, TagSublayer::ffn);
    const float* out = store.get<float>(ActivationTag::expert_gate_up, layer, 5000);
    for (int i = 0; i < 5000; ++i) ASSERT_EQ(out[i], float(i + layer));
    store.end_backward(layer, TagSublayer::ffn);
    store.begin_backward(layer, TagSublayer::mixer);
    store.end_backward(layer, TagSublayer::mixer);
  }
  EXPECT_EQ(store.counters().swapped_out_bytes, 40000);
  EXPECT_EQ(store.counters().read_back_bytes, 40000);
  EXPECT_EQ(MemoryStats::current(Tier::slow), 0);
  EXPECT_THROW(store.set_policy(ActivationTag::attn_input, SavePolicy::recompute), Error);
  EXPECT_THROW(store.set_policy(ActivationTag::final_norm_out, SavePolicy::recompute), Error);
}

// The rows that came over the expert exchange: no preset recomputes them and naming one is refused
// (a re-run does not exchange again), but for the owners' activations, which their fused backward
// rebuilds from the received rows with no re-run; the selective swap moves them all with the GEMM
// outputs.
TEST(SavePolicies, ExchangedRowsAreNeverRecomputedButTheRebuiltOnesAndSwapSelectiveMovesThem) {
  int exchanged = 0, rebuilt = 0;
  const std::vector<ActivationTag> swapped = swap_tags("selective");
  for (int i = 0; i < kNumActivationTags; ++i) {
    const ActivationTag tag = static_cast<ActivationTag>(i);
    if (tag_kind(tag) != TagKind::exchanged) continue;
    ++exchanged;
    rebuilt += rebuilt_by_its_backward(tag) ? 1 : 0;
    for (const char* spec : {"selective", "full"}) {
      const std::vector<ActivationTag> recomputed = recompute_tags(spec);
      EXPECT_EQ(std::count(recomputed.begin(), recomputed.end(), tag), rebuilt_by_its_backward(tag) ? 1 : 0)
          << spec << " " << activation_tag_name(tag);
    }
    EXPECT_EQ(std::count(swapped.begin(), swapped.end(), tag), 1) << activation_tag_name(tag);
  }
  EXPECT_EQ(exchanged, 5);  // ep_row_source, ep_received, ep_gate_up, ep_act, ep_weight
  EXPECT_EQ(rebuilt, 2);    // ep_gate_up, ep_act
  ActivationStore store;
  apply_save_policies(store, "ep_gate_up,ep_act", "none");
  EXPECT_EQ(store.policy(ActivationTag::ep_act), SavePolicy::recompute);
  try {
    apply_save_policies(store, "router_logits,ep_received", "none");
    ADD_FAILURE() << "--recompute ep_received was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute router_logits,ep_received: activation ep_received cannot be "
                                         "recomputed: it came over the expert exchange"),
              std::string::npos)
        << e.what();
  }
}

// A dropped tag its backward rebuilds never makes recompute re-run its sublayer.
TEST(SavePolicies, RebuiltTagsAskForNoReRun) {
  for (int i = 0; i < kNumActivationTags; ++i) {
    const ActivationTag tag = static_cast<ActivationTag>(i);
    if (!rebuilt_by_its_backward(tag)) continue;
    for (TagSublayer part : {TagSublayer::mixer, TagSublayer::ffn})
      EXPECT_FALSE(recompute_reruns(tag, part)) << activation_tag_name(tag);
  }
  EXPECT_TRUE(recompute_reruns(ActivationTag::router_logits, TagSublayer::ffn));
  ActivationStore store;
  store.set_paged_min_bytes(1);
  store.set_policy(ActivationTag::expert_act, SavePolicy::recompute);
  store.save<float>(ActivationTag::expert_act, 0, 100);
  store.end_forward(0, TagSublayer::ffn);
  EXPECT_TRUE(store.dropped(ActivationTag::expert_act, 0));
  EXPECT_FALSE(store.reruns(0, TagSublayer::ffn));
  store.clear();
}

// --swap-bf16: float32 tensors come back rounded to bfloat16, int32 ones exactly.
TEST(ActivationStore, Bf16SwapIsLossyForFloatsOnly) {
  ActivationStore store;
  swap_every_entry_synchronously(store);
  store.set_swap_bf16(true);
  store.set_policy(ActivationTag::expert_gate_up, SavePolicy::swap);
  store.set_policy(ActivationTag::router_index, SavePolicy::swap);
  float* out = store.save<float>(ActivationTag::expert_gate_up, 0, 3000);
  int32_t* index = store.save<int32_t>(ActivationTag::router_index, 0, 3000);
  for (int i = 0; i < 3000; ++i) out[i] = 1.0f + float(i) / 4096.0f, index[i] = 100000 + i;
  store.end_forward(0, TagSublayer::ffn);
  EXPECT_EQ(MemoryStats::current(Tier::slow), PageArena::rounded(3000 * 2) + PageArena::rounded(3000 * 4));
  store.begin_backward(0, TagSublayer::ffn);
  const float* back = store.get<float>(ActivationTag::expert_gate_up, 0, 3000);
  const int32_t* index_back = store.get<int32_t>(ActivationTag::router_index, 0, 3000);
  int rounded = 0;
  for (int i = 0; i < 3000; ++i) {
    const float expected = static_cast<float>(bf16_to_double(bf16_from_double(1.0f + float(i) / 4096.0f)));
    ASSERT_EQ(back[i], expected) << i;
    rounded += back[i] != 1.0f + float(i) / 4096.0f ? 1 : 0;
    ASSERT_EQ(index_back[i], 100000 + i);
  }
  EXPECT_GT(rounded, 0);  // lossy indeed
  store.end_backward(0, TagSublayer::ffn);
}

// The backward in parts: a layer's FFN part reads its FFN entries back and prefetches its mixer's;
// the mixer part prefetches the FFN entries of the layer below (not yet its mixer's); each part's
// end frees its own entries. A layer whose backward comes next (backward_next) is never swapped.
TEST(ActivationStore, BackwardPartsPrefetchTheNextPartOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the swap engine runs a thread
  ActivationStore store;
  swap_every_entry_synchronously(store);
  store.set_policy(ActivationTag::q, SavePolicy::swap);
  store.set_policy(ActivationTag::expert_gate_up, SavePolicy::swap);
  const int64_t before = MemoryStats::current(Tier::fast);
  for (int layer = 0; layer < 3; ++layer) {
    float* q = store.save<float>(ActivationTag::q, layer, 1000);           // mixer: 4000 bytes
    float* out = store.save<float>(ActivationTag::expert_gate_up, layer, 2000);  // FFN: 8000 bytes
    q[3] = float(layer), out[5] = float(10 + layer);
    store.end_forward(layer, TagSublayer::mixer, /*backward_next=*/layer == 2);
    store.end_forward(layer, TagSublayer::ffn, /*backward_next=*/layer == 2);
  }
  EXPECT_EQ(store.counters().swapped_out_bytes, 2 * 12000);  // layer 2 stays resident
  EXPECT_EQ(store.get<float>(ActivationTag::q, 2, 1000)[3], 2.0f);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before + 12000);
  store.begin_backward(2, TagSublayer::ffn);
  store.end_backward(2, TagSublayer::ffn);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before + 4000);  // the FFN's entries are freed
  store.begin_backward(2, TagSublayer::mixer);  // prefetches layer 1's FFN entries, not its mixer's
  EXPECT_EQ(store.counters().read_back_bytes, 8000);
  store.end_backward(2, TagSublayer::mixer);
  EXPECT_FALSE(store.contains(ActivationTag::q, 2));
  store.begin_backward(1, TagSublayer::ffn);  // its FFN entries are in; its mixer's are prefetched
  EXPECT_EQ(store.get<float>(ActivationTag::expert_gate_up, 1, 2000)[5], 11.0f);
  EXPECT_EQ(store.counters().read_back_bytes, 12000);
  EXPECT_DEATH(store.get<float>(ActivationTag::q, 0, 1000), "not resident \\(swapped out\\)");
  store.end_backward(1, TagSublayer::ffn);
  EXPECT_DEATH(store.get<float>(ActivationTag::expert_gate_up, 1, 2000), "consumed by its backward");
  store.begin_backward(1, TagSublayer::mixer);
  EXPECT_EQ(store.get<float>(ActivationTag::q, 1, 1000)[3], 1.0f);
  store.end_backward(1, TagSublayer::mixer);
  store.begin_backward(0, TagSublayer::ffn);
  store.end_backward(0, TagSublayer::ffn);
  store.begin_backward(0, TagSublayer::mixer);
  EXPECT_EQ(store.get<float>(ActivationTag::q, 0, 1000)[3], 0.0f);
  store.end_backward(0, TagSublayer::mixer);
  EXPECT_EQ(store.counters().read_back_bytes, 24000);
  EXPECT_EQ(MemoryStats::current(Tier::fast), before);
  EXPECT_EQ(MemoryStats::current(Tier::slow), 0);
}

// Recompute of the mixer starts from attn_input, before the FFN's backward: a swapped attn_input
// comes back with the FFN part (and with the prefetch of the layer below's FFN part).
TEST(ActivationStore, RecomputeCheckpointComesBackWithTheFfnPart) {
  ActivationStore store;
  swap_every_entry_synchronously(store);
  store.set_policy(ActivationTag::attn_input, SavePolicy::swap);
  store.set_policy(ActivationTag::q, SavePolicy::recompute);
  for (int layer = 0; layer < 2; ++layer) {
    store.save<float>(ActivationTag::attn_input, layer, 1000)[1] = float(layer + 1);
    store.save<float>(ActivationTag::q, layer, 1000);
    store.end_forward(layer, TagSublayer::mixer);
  }
  EXPECT_TRUE(store.reruns(1, TagSublayer::mixer));
  store.begin_backward(1, TagSublayer::ffn);
  EXPECT_EQ(store.get<float>(ActivationTag::attn_input, 1, 1000)[1], 2.0f);
  store.end_backward(1, TagSublayer::ffn);
  store.begin_backward(1, TagSublayer::mixer);
  EXPECT_EQ(store.counters().read_back_bytes, 8000);  // layer 0's checkpoint is prefetched
  store.end_backward(1, TagSublayer::mixer);
  store.begin_backward(0, TagSublayer::ffn);
  EXPECT_EQ(store.get<float>(ActivationTag::attn_input, 0, 1000)[1], 1.0f);
  store.end_backward(0, TagSublayer::ffn);
  store.clear();
}

TEST(ActivationStoreDeathTest, MissingOrMisSizedActivationAborts) {
  ActivationStore store;
  store.save<float>(ActivationTag::v, 2, 8);
  EXPECT_DEATH(store.get<float>(ActivationTag::v, 3, 8), "activation v of layer 3 was not saved");
  EXPECT_DEATH(store.get<float>(ActivationTag::v, 2, 9), "activation v of layer 2 has 32 bytes");
  EXPECT_DEATH(store.save<float>(ActivationTag::v, 2, 8), "saved twice");
}

}  // namespace
}  // namespace trillion
