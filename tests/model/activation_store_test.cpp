// The activation store: storage per (tag, layer), bytes counted and freed at clear().
#include "memory/activation_store.h"

#include <gtest/gtest.h>

namespace trillion {
namespace {

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

TEST(ActivationStoreDeathTest, MissingOrMisSizedActivationAborts) {
  ActivationStore store;
  store.save<float>(ActivationTag::v, 2, 8);
  EXPECT_DEATH(store.get<float>(ActivationTag::v, 3, 8), "activation v of layer 3 was not saved");
  EXPECT_DEATH(store.get<float>(ActivationTag::v, 2, 9), "activation v of layer 2 has 32 bytes");
  EXPECT_DEATH(store.save<float>(ActivationTag::v, 2, 8), "saved twice");
}

}  // namespace
}  // namespace trillion
