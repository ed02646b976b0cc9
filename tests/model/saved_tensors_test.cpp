// A layer kind's saved-tensor declaration (model/saved_tensors.h) drives its forward's buffers, its
// backward's reads and the plan's bytes: the writer saves each tensor with its declared shape (or
// hands out scratch when nothing is saved, or when the pass does not keep it), the reader returns
// what was written, the plan counts decisions as int32 and the rest in the model's type, and a tag
// outside the declaration or read with the wrong element type stops the program.
#include "model/saved_tensors.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/memory.h"
#include "memory/activation_store.h"

namespace trillion {
namespace {

using Tag = ActivationTag;

std::vector<SavedTensor> declaration(int64_t n) {
  return {{Tag::q, {n, 2, 3}},                // [n, 2, 3]
          {Tag::attn_indices, {n, 4}},        // [n, 4] int32
          {Tag::idx_k_raw, {n, 5}, false}};  // [n, 5] a temporary of this pass
}

TEST(SavedTensors, TheDeclarationShapesTheStoreEntriesAndTheReadsReturnThem) {
  const int64_t n = 7;
  ActivationStore store;
  Arena scratch(Tier::fast, int64_t{1} << 20);
  const SavedWriter saves(declaration(n), &store, 3, scratch);
  float* q = saves.out<float>(Tag::q);                        // [n, 2, 3]
  int32_t* indices = saves.out<int32_t>(Tag::attn_indices);  // [n, 4]
  float* temporary = saves.out<float>(Tag::idx_k_raw);       // [n, 5]
  q[n * 6 - 1] = 1.5f;
  indices[n * 4 - 1] = 9;
  temporary[n * 5 - 1] = 2.0f;  // within the scratch it was given
  EXPECT_EQ(store.shape(Tag::q, 3), (Shape{n, 2, 3}));
  EXPECT_EQ(store.shape(Tag::attn_indices, 3), (Shape{n, 4}));
  EXPECT_FALSE(store.contains(Tag::idx_k_raw, 3)) << "not kept in this pass";

  const SavedReader saved(declaration(n), store, 3);
  EXPECT_EQ(saved.in<float>(Tag::q), q);
  EXPECT_EQ(saved.in<float>(Tag::q)[n * 6 - 1], 1.5f);
  EXPECT_EQ(saved.in<int32_t>(Tag::attn_indices)[n * 4 - 1], 9);
}

TEST(SavedTensors, WithoutAStoreEveryTensorIsScratch) {
  const int64_t n = 5;
  Arena scratch(Tier::fast, int64_t{1} << 20);
  const SavedWriter saves(declaration(n), nullptr, 0, scratch);
  const int64_t before = scratch.used_bytes();
  saves.out<double>(Tag::q);
  saves.out<int32_t>(Tag::attn_indices);
  EXPECT_EQ(scratch.used_bytes() - before,
            Arena::rounded(n * 6 * int64_t(sizeof(double))) + Arena::rounded(n * 4 * int64_t(sizeof(int32_t))));
}

TEST(SavedTensors, ThePlanCountsKeptTensorsDecisionsAsInt32) {
  const std::vector<SavedSize> sizes = saved_sizes(declaration(7), 8);
  ASSERT_EQ(sizes.size(), 2u) << "the temporary is not counted";
  EXPECT_EQ(sizes[0].tag, Tag::q);
  EXPECT_EQ(sizes[0].bytes, 7 * 6 * 8);
  EXPECT_EQ(sizes[1].tag, Tag::attn_indices);
  EXPECT_EQ(sizes[1].bytes, 7 * 4 * 4);
}

TEST(SavedTensorsDeathTest, UndeclaredTagsAndWrongElementTypesStop) {
  ActivationStore store;
  Arena scratch(Tier::fast, int64_t{1} << 20);
  const SavedWriter saves(declaration(3), &store, 0, scratch);
  EXPECT_DEATH(saves.out<float>(Tag::k), "saved tensor k is not in its layer kind's saved_tensors");
  EXPECT_DEATH(saves.out<float>(Tag::attn_indices), "attn_indices: element type does not match its tag's kind");
  EXPECT_DEATH(saves.out<int32_t>(Tag::q), "q: element type does not match its tag's kind");
  const SavedReader saved(declaration(3), store, 0);
  EXPECT_DEATH(saved.in<float>(Tag::idx_k_raw), "idx_k_raw is not kept in this pass");
}

}  // namespace
}  // namespace trillion
