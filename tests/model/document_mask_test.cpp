// Document masks (Model::set_document_mask): a packed batch of rows holding several documents each
// gives, in double, the same loss and the same gradients as its documents run one by one, for
// every mixer kind that takes document boundaries (full attention, dense and MoE FFNs, MLA, Gated
// DeltaNet and Kimi Delta Attention with their short convolutions); sparse attention, which does
// not yet, is refused by name.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "ops/cross_entropy.h"
#include "test_configs.h"

namespace trillion {
namespace {

constexpr int32_t kEos = 1;
constexpr int64_t kSeq = 24;
// Document lengths of each row (they fill it; the last one is cut by the row's end, no eos).
const std::vector<std::vector<int64_t>> kRows = {{7, 10, 7}, {5, 1, 18}};

class DocumentMask : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { omp_set_num_threads(1); }
};

TEST_P(DocumentMask, PackedRowsEqualTheirDocumentsRunSeparately) {
  const ModelConfig config = ModelConfig::load(testing::model_config_path(GetParam()));
  const int64_t V = config.vocab_size, rows = static_cast<int64_t>(kRows.size());
  std::vector<int32_t> tokens(rows * kSeq), targets(rows * kSeq);  // [rows, seq] each
  const CounterRng rng(4, "document mask");
  for (int64_t i = 0; i < rows * kSeq; ++i) {
    tokens[i] = 2 + static_cast<int32_t>(rng.bits(2 * i) % (V - 2));  // never the eos
    targets[i] = static_cast<int32_t>(rng.bits(2 * i + 1) % V);
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (size_t d = 0; d < kRows[r].size(); ++d) {
      at += kRows[r][d];
      if (d + 1 < kRows[r].size()) {
        tokens[r * kSeq + at - 1] = kEos;        // the document's last input
        targets[r * kSeq + at - 1] = kIgnoreIndex;  // would predict across the boundary
      }
    }
    ASSERT_EQ(at, kSeq);
  }
  const LossScales scales{1.0, 0.0};  // batch statistics (aux losses) differ between the two

  Model<double> packed(config);
  packed.init_weights(9);
  packed.set_document_mask(kEos);
  packed.zero_grads();
  const CrossEntropyResult whole = packed.forward_backward(tokens.data(), targets.data(), rows, kSeq, scales).lm;

  Model<double> separate(config);
  separate.init_weights(9);
  separate.zero_grads();
  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (const int64_t length : kRows[r]) {
      const CrossEntropyResult part =
          separate.forward_backward(tokens.data() + r * kSeq + at, targets.data() + r * kSeq + at, 1, length, scales).lm;
      loss_sum += part.loss_sum;
      count += part.count;
      at += length;
    }
  }
  EXPECT_EQ(whole.count, count);
  EXPECT_NEAR(whole.loss_sum, loss_sum, 1e-10 * std::abs(loss_sum));
  const int64_t n = packed.table().trainable_size();
  double worst = 0.0, largest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(packed.grads()[i] - separate.grads()[i]));
    largest = std::max(largest, std::abs(separate.grads()[i]));
  }
  EXPECT_GT(largest, 0.0);
  EXPECT_LE(worst, 1e-10 * largest) << "gradients of the packed batch and the separate documents";
}

INSTANTIATE_TEST_SUITE_P(AttentionKinds, DocumentMask,
                         ::testing::Values("tiny.json", "tiny_qwen3_moe.json", "tiny_glm4_moe.json",
                                           "tiny_deepseek_v3.json", "tiny_qwen3_next_hybrid.json",
                                           "tiny_qwen3_next_moe.json", "tiny_kimi_linear_kda.json",
                                           "tiny_kimi_linear.json"),
                         testing::config_test_name);

TEST(DocumentMaskKinds, MixersWithoutDocumentBoundariesAreRefusedByName) {
  for (const char* name : {"tiny_deepseek_v32.json", "tiny_qwen3_sparse.json"}) {
    Model<float> model(ModelConfig::load(testing::model_config_path(name)));
    try {
      model.set_document_mask(kEos);
      ADD_FAILURE() << name << ": expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is sparse_attention"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace trillion
