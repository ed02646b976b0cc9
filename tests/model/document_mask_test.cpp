// Document masks (Model::set_document_mask): a packed batch of rows holding several documents each
// gives, in double, the same loss and the same gradients as its documents run one by one, for
// every mixer kind (full attention, dense and MoE FFNs, MLA, Gated DeltaNet and Kimi Delta Attention
// with their short convolutions, sparse attention with its indexer in every training mode).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/atomic_file.h"
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

// Runs the packed rows (document masks on) and their documents one by one, with the indexers of
// sparse attention layers trained in `mode` at coefficient indexer_coef (0: no indexer loss), and
// expects the same LM loss, indexer losses and gradients. The indexer loss is a mean over a call's
// tokens, so each separate call's aux scale is its share of the packed batch's tokens; the config
// must then have no router aux loss (its batch statistics differ between the two).
void expect_packed_equals_separate(const ModelConfig& config, IndexerMode mode, double indexer_coef) {
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
  const double aux = indexer_coef > 0.0 ? 1.0 : 0.0;  // batch statistics (router aux losses) differ
  const double packed_tokens = double(rows * kSeq);

  Model<double> packed(config);
  packed.init_weights(9);
  packed.set_document_mask(kEos);
  packed.set_indexer_training(mode, indexer_coef);
  packed.zero_grads();
  const StepResult whole = packed.forward_backward(tokens.data(), targets.data(), rows, kSeq, {1.0, aux});

  Model<double> separate(config);
  separate.init_weights(9);
  separate.set_indexer_training(mode, indexer_coef);
  separate.zero_grads();
  double loss_sum = 0.0;
  int64_t count = 0;
  std::vector<double> indexer_sums(whole.indexer.size(), 0.0);  // [sparse layers] Σ loss · tokens
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (const int64_t length : kRows[r]) {
      const StepResult part = separate.forward_backward(tokens.data() + r * kSeq + at, targets.data() + r * kSeq + at,
                                                        1, length, {1.0, aux * double(length) / packed_tokens});
      loss_sum += part.lm.loss_sum;
      count += part.lm.count;
      ASSERT_EQ(part.indexer.size(), indexer_sums.size());
      for (size_t i = 0; i < part.indexer.size(); ++i) indexer_sums[i] += part.indexer[i].loss * double(length);
      at += length;
    }
  }
  EXPECT_EQ(whole.lm.count, count);
  EXPECT_NEAR(whole.lm.loss_sum, loss_sum, 1e-10 * std::abs(loss_sum));
  EXPECT_EQ(whole.indexer.empty(), indexer_coef == 0.0);
  for (size_t i = 0; i < whole.indexer.size(); ++i) {
    EXPECT_GT(indexer_sums[i], 0.0) << "layer " << whole.indexer[i].layer;
    EXPECT_NEAR(whole.indexer[i].loss * packed_tokens, indexer_sums[i], 1e-10 * indexer_sums[i])
        << "indexer loss of layer " << whole.indexer[i].layer;
  }
  const int64_t n = packed.table().trainable_size();
  double worst = 0.0, largest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(packed.grads()[i] - separate.grads()[i]));
    largest = std::max(largest, std::abs(separate.grads()[i]));
  }
  EXPECT_GT(largest, 0.0);
  EXPECT_LE(worst, 1e-10 * largest) << "gradients of the packed batch and the separate documents";
}

TEST_P(DocumentMask, PackedRowsEqualTheirDocumentsRunSeparately) {
  expect_packed_equals_separate(ModelConfig::load(testing::model_config_path(GetParam())), IndexerMode::sparse, 0.0);
}

INSTANTIATE_TEST_SUITE_P(AttentionKinds, DocumentMask,
                         ::testing::Values("tiny.json", "tiny_qwen3_moe.json", "tiny_glm4_moe.json",
                                           "tiny_deepseek_v3.json", "tiny_qwen3_next_hybrid.json",
                                           "tiny_qwen3_next_moe.json", "tiny_kimi_linear_kda.json",
                                           "tiny_kimi_linear.json"),
                         testing::config_test_name);

// Sparse attention (DeepSeek-V3.2's DSA, and the Qwen3 variant of it): the indexer's top-k stays
// within each document, and its loss, dense or over the selection, equals that of the documents.
TEST(DocumentMaskSparseAttention, PackedRowsEqualTheirDocumentsInEveryIndexerMode) {
  for (const char* name : {"tiny_deepseek_v32.json", "tiny_qwen3_sparse.json"}) {
    nlohmann::json json = nlohmann::json::parse(read_file(testing::model_config_path(name)));
    json["router_aux_loss_coef"] = 0.0;
    const ModelConfig config = ModelConfig::from_json(json, name);
    for (const IndexerMode mode : {IndexerMode::sparse, IndexerMode::dense, IndexerMode::warmup}) {
      for (const double coef : {0.0, 1.0}) {
        SCOPED_TRACE(std::string(name) + ", indexer mode " + indexer_mode_name(mode) + ", coef " + std::to_string(coef));
        expect_packed_equals_separate(config, mode, coef);
      }
    }
  }
}

}  // namespace
}  // namespace trillion
