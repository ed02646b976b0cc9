// `trillion info --config FILE [--json] [LoRA flags]`: what a config describes, without allocating
// the model: its layer kinds (mixer and FFN per layer; how many are sparse attention, and the MoE
// layers' router: softmax or sigmoid with the correction bias), its total and active parameter counts
// (model.h count_parameters), and with an adapter (train's --lora-* flags, --lora-config or
// --adapter) the parameters it trains, so a large config can be checked on a small machine.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/config.h"
#include "model/family.h"
#include "model/lora_config.h"
#include "model/model.h"

namespace trillion {
namespace {

void run_info(const std::string& config_path, bool json, const LoraOptions& lora) {
  ModelConfig config = ModelConfig::load(config_path);
  if (std::optional<LoraConfig> adapter = lora.config())
    config.lora = std::make_shared<const LoraConfig>(std::move(*adapter));
  const ParamCounts counts = count_parameters(config);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.is_moe_layer(l);
  const int64_t sparse_layers = config.sparse_layers();
  const char* router = moe_layers == 0                                                 ? "none"
                       : family_of(config.model_type).router == RouterScoring::sigmoid ? "sigmoid"
                                                                                       : "softmax";
  if (json) {
    std::printf("%s\n", nlohmann::json({{"config", config_path},
                                        {"model_type", config.model_type},
                                        {"layers", config.num_hidden_layers},
                                        {"moe_layers", moe_layers},
                                        {"sparse_layers", sparse_layers},
                                        {"router", router},
                                        {"total_parameters", counts.total},
                                        {"active_parameters", counts.active},
                                        {"dense_parameters", counts.dense},
                                        {"expert_parameters", counts.expert},
                                        {"buffer_elements", counts.buffer},
                                        {"trainable_parameters", counts.trainable},
                                        {"parameters_with_adapters", counts.with_adapters},
                                        {"trainable_storage", counts.trainable_storage}})
                            .dump()
                            .c_str());
    return;
  }
  std::printf("%s: %s, %lld layers (%lld MoE, %s router; %lld sparse attention)\n", config_path.c_str(),
              config.model_type.c_str(), static_cast<long long>(config.num_hidden_layers),
              static_cast<long long>(moe_layers), router, static_cast<long long>(sparse_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    std::printf("  layer %3lld: %s + %s\n", static_cast<long long>(l), layer_type_name(config.layer_types[l]),
                config.is_moe_layer(l) ? "moe" : "dense mlp");
  std::printf("parameters: %lld total (%.2f B), %lld active per token (%.2f B); dense %lld, experts %lld\n",
              static_cast<long long>(counts.total), double(counts.total) * 1e-9, static_cast<long long>(counts.active),
              double(counts.active) * 1e-9, static_cast<long long>(counts.dense), static_cast<long long>(counts.expert));
  if (config.lora != nullptr)
    std::printf("LoRA: %lld trainable parameters of %lld (%.3f %%)\n", static_cast<long long>(counts.trainable),
                static_cast<long long>(counts.with_adapters), 100.0 * double(counts.trainable) / double(counts.with_adapters));
}

}  // namespace

void register_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Layer kinds and total / active parameter counts of a config");
  auto config_path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--config", *config_path, "Model config.json")->required();
  cmd->add_flag("--json", *json, "One JSON object instead of text");
  auto lora = std::make_shared<LoraOptions>();
  add_lora_options(cmd, *lora, "Count");
  cmd->callback([cmd, config_path, json, lora] {
    check_lora_options(cmd, *lora);
    run_info(*config_path, *json, *lora);
  });
}

}  // namespace trillion
