// A layer kind's saved-tensor declaration (model/saved_tensors.h) drives its forward's buffers, its
// backward's reads and the plan's bytes: the writer saves each tensor with its declared shape (or
// hands out scratch when nothing is saved, or when the pass does not keep it), the reader returns
// what was written, the plan counts decisions as int32 and the rest in the model's type, and a tag
// outside the declaration or read with the wrong element type stops the program.
#include "model/saved_tensors.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/bf16.h"
#include "core/memory.h"
#include "core/rng.h"
#include "memory/activation_store.h"
#include "ops/gemm.h"

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
  const std::vector<SavedSize> sizes = saved_sizes(declaration(7), 8, /*bf16_operands=*/true);
  ASSERT_EQ(sizes.size(), 2u) << "the temporary is not counted";
  EXPECT_EQ(sizes[0].tag, Tag::q);
  EXPECT_EQ(sizes[0].bytes, 7 * 6 * 8);
  EXPECT_EQ(sizes[1].tag, Tag::attn_indices);
  EXPECT_EQ(sizes[1].bytes, 7 * 4 * 4);
}

// q read only by products: with bf16 operands the store keeps its rounding.
std::vector<SavedTensor> operand_declaration(int64_t n) {
  return {{Tag::q, {n, 6}, /*kept=*/true, /*operand=*/true},  // [n, 6]
          {Tag::attn_indices, {n, 4}}};                       // [n, 4] int32
}

TEST(SavedTensors, ADeclaredOperandIsKeptAsItsBf16RoundingAndProductsReadIt) {
  const int64_t n = 9, cols = 6, before = MemoryStats::current(Tier::fast);
  const CounterRng rng(5, "saved operand");
  std::vector<float> values(n * cols);  // [n, 6]
  for (int64_t i = 0; i < n * cols; ++i) values[i] = float(rng.normal(i));
  const MatmulPrecisionScope bf16_products(MatmulPrecision::bf16);
  ActivationStore store;
  Arena scratch(Tier::fast, int64_t{1} << 20);
  {
    const SavedWriter saves(operand_declaration(n), &store, 2, scratch);
    float* q = saves.out<float>(Tag::q);  // [n, 6] the float staging
    std::copy(values.begin(), values.end(), q);
    saves.out<int32_t>(Tag::attn_indices);
  }
  store.end_forward(2, TagSublayer::mixer);
  const std::vector<ActivationStore::EntryInfo> entries = store.entries(2);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].type, SavedType::bf16);
  EXPECT_EQ(entries[0].bytes, n * cols * 2) << "half a float's bytes";
  EXPECT_EQ(entries[1].type, SavedType::i32);

  store.begin_backward(2, TagSublayer::mixer);
  const SavedReader saved(operand_declaration(n), store, 2);
  const float* q = saved.in<float>(Tag::q);  // [n, 6] the rounding, widened
  for (int64_t i = 0; i < n * cols; ++i) ASSERT_EQ(q[i], round_to_bf16(values[i])) << i;
  EXPECT_EQ(saved.in<float>(Tag::q), q) << "one view per entry";
  // A product under the bf16 precision reads the entry itself: with the view's floats overwritten,
  // qᵀ·q still gives the rounding's product.
  std::vector<bf16> rounded(n * cols);  // [n, 6]
  to_bf16(values.data(), rounded.data(), n * cols);
  std::vector<float> expected(cols * cols), product(cols * cols);  // [6, 6]
  gemm_bf16(true, false, cols, cols, n, 1.0f, rounded.data(), cols, rounded.data(), cols, 0.0f, expected.data(), cols);
  std::fill(const_cast<float*>(q), const_cast<float*>(q) + n * cols, 0.0f);
  gemm<float>(true, false, cols, cols, n, 1.0f, q, cols, q, cols, 0.0f, product.data(), cols);
  EXPECT_EQ(product, expected);
  store.end_backward(2, TagSublayer::mixer);
  store.clear();
  EXPECT_EQ(MemoryStats::current(Tier::fast), before + scratch.used_bytes()) << "the float copies are freed";
}

TEST(SavedTensors, ThePlanCountsABf16OperandAtTwoBytesAndItsFloatCopy) {
  const std::vector<SavedSize> bf16_operands = saved_sizes(operand_declaration(7), 4, true);
  EXPECT_EQ(bf16_operands[0].bytes, 7 * 6 * 2);
  EXPECT_EQ(bf16_operands[0].float_copy, 7 * 6 * 4);
  EXPECT_EQ(bf16_operands[1].bytes, 7 * 4 * 4);
  EXPECT_EQ(bf16_operands[1].float_copy, 0);
  for (const auto& [element_bytes, bf16] : {std::pair{int64_t(4), false}, std::pair{int64_t(8), true}}) {
    const std::vector<SavedSize> sizes = saved_sizes(operand_declaration(7), element_bytes, bf16);
    EXPECT_EQ(sizes[0].bytes, 7 * 6 * element_bytes) << "float products without bf16 operands, or double";
    EXPECT_EQ(sizes[0].float_copy, 0);
  }
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
