// `trillion generate`: continues a prompt with a checkpoint, batch 1 with the model's KV cache,
// sampling with temperature and nucleus top-p from the counter-based RNG (temperature 0: greedy),
// and prints the prompt and its continuation, decoded. Generation stops at the end-of-document token,
// and at ChatML's end of turn (<|im_end|>) when the tokenizer holds it as a piece: a chat model's
// answer ends there, as Qwen's generation_config lists it among its eos_token_id.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "data/mixture.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/run_setup.h"
#include "train/sampling.h"

namespace trillion {
namespace {
namespace fs = std::filesystem;

struct GenerateOptions {
  std::string checkpoint;
  std::string data_dir;
  std::string tokenizer_path;
  std::string prompt;
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 0;
  std::string precision;  // "fp32" | "bf16"; empty: the checkpoint's (fp32 without state)
  std::string adapter;    // a PEFT LoRA adapter on the weights; empty: the checkpoint's own, if any
};

// The tokenizer: --tokenizer, else --data DIR's (tokenizer_file_in), else the checkpoint's copy, else the
// training data directory recorded in trainer_state.json.
std::string find_tokenizer(const GenerateOptions& o, const std::string& weights_dir, const TrainerState* state) {
  if (!o.tokenizer_path.empty()) return o.tokenizer_path;
  if (!o.data_dir.empty()) return tokenizer_file_in(parse_data_mixture(o.data_dir).front().directory);
  const std::string copy = tokenizer_file_in(weights_dir);
  if (fs::exists(copy)) return copy;
  if (state != nullptr) return tokenizer_file_in(parse_data_mixture(state->data_dir).front().directory);
  fail(weights_dir, ": has no tokenizer.model or tokenizer.json and no trainer_state.json; pass --tokenizer or --data");
}

// A token that ends the continuation (not printed).
struct StopToken {
  int32_t id;
  const char* name;
};

template <class T>
std::vector<int32_t> generate_tokens(const ModelConfig& config, const std::string& weights_dir,
                                     const std::string& adapter, const std::vector<int32_t>& prompt,
                                     int64_t usable_vocab, const std::vector<StopToken>& stops,
                                     const GenerateOptions& o) {
  Model<T> model(config);
  model.load_weights(weights_dir);
  if (!adapter.empty()) model.load_adapter(adapter);
  model.start_generation(static_cast<int64_t>(prompt.size()) + o.max_new_tokens);
  std::vector<T> logits(config.vocab_size);           // [vocab]
  std::vector<double> candidate_logits(usable_vocab);  // [usable_vocab]
  const CounterRng rng(o.seed, "generate");
  std::vector<int32_t> generated;
  model.generate_step(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data());
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    for (int64_t v = 0; v < usable_vocab; ++v) candidate_logits[v] = static_cast<double>(logits[v]);
    const int32_t next = sample_token(candidate_logits, o.sampling, rng.uniform(static_cast<uint64_t>(i)));
    const auto stop = std::find_if(stops.begin(), stops.end(), [&](const StopToken& s) { return s.id == next; });
    if (stop != stops.end()) {
      std::fprintf(stderr, "stopped at %s (token %d)\n", stop->name, next);
      break;
    }
    generated.push_back(next);
    if (i + 1 < o.max_new_tokens) model.generate_step(&next, 1, logits.data());
  }
  return generated;
}

void run_generate(const GenerateOptions& o) {
  if (o.sampling.temperature < 0) fail("--temperature must be ≥ 0, got ", o.sampling.temperature);
  if (!(o.sampling.top_p > 0 && o.sampling.top_p <= 1)) fail("--top-p must be in (0, 1], got ", o.sampling.top_p);
  if (o.max_new_tokens < 0) fail("--max-new-tokens must be ≥ 0, got ", o.max_new_tokens);
  const std::string weights_dir = resolve_weights_dir(o.checkpoint);
  ModelConfig config = ModelConfig::load((fs::path(weights_dir) / "config.json").string());
  const std::string adapter = attach_adapter(config, weights_dir, o.adapter);
  const fs::path state_path = fs::path(weights_dir) / "trainer_state.json";
  std::unique_ptr<TrainerState> state;
  if (fs::exists(state_path)) state = std::make_unique<TrainerState>(TrainerState::load(state_path.string()));
  const std::string tokenizer_path = find_tokenizer(o, weights_dir, state.get());
  const Tokenizer tokenizer(tokenizer_path);
  if (state != nullptr && tokenizer.hash() != state->tokenizer_hash) {
    fail(state_path.string(), ": field 'tokenizer_hash' does not match ", tokenizer_path,
         "; the checkpoint was trained with a different tokenizer");
  }
  if (tokenizer.vocab_size() > config.vocab_size) {
    fail(tokenizer_path, ": vocab size ", tokenizer.vocab_size(), " exceeds the model's vocab_size ", config.vocab_size);
  }
  std::vector<int32_t> prompt = tokenizer.encode(o.prompt);
  const bool empty_prompt = prompt.empty();
  if (empty_prompt) prompt.push_back(tokenizer.eos_id());  // start of a new document
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
  if (total > config.max_position_embeddings) {
    fail("prompt (", prompt.size(), " tokens) + --max-new-tokens ", o.max_new_tokens,
         " exceeds the model's max_position_embeddings ", config.max_position_embeddings);
  }
  set_matmul_precision(checkpoint_matmul_precision(o.precision, state ? &state->settings : nullptr));
  const auto start = std::chrono::steady_clock::now();
  const bool use_double = state != nullptr && state->settings.dtype == "float64";
  std::vector<StopToken> stops = {{tokenizer.eos_id(), "the end of the document"}};
  if (const std::optional<int32_t> turn_end = tokenizer.piece_id(kChatEnd)) stops.push_back({*turn_end, kChatEnd});
  const std::vector<int32_t> generated =
      use_double ? generate_tokens<double>(config, weights_dir, adapter, prompt, tokenizer.vocab_size(), stops, o)
                 : generate_tokens<float>(config, weights_dir, adapter, prompt, tokenizer.vocab_size(), stops, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<int32_t> text_ids = empty_prompt ? std::vector<int32_t>() : prompt;
  text_ids.insert(text_ids.end(), generated.begin(), generated.end());
  std::printf("%s\n", tokenizer.decode(text_ids).c_str());
  std::fprintf(stderr, "generated %zu tokens in %.2f s\n", generated.size(), seconds);
}

}  // namespace

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt with a trained checkpoint");
  auto options = std::make_shared<GenerateOptions>();
  GenerateOptions& o = *options;
  cmd->add_option("--checkpoint", o.checkpoint, "Checkpoint directory or a training --out directory")->required();
  cmd->add_option("--data", o.data_dir, "Tokenized data directory whose tokenizer.model to use");
  cmd->add_option("--tokenizer", o.tokenizer_path, "SentencePiece model or tokenizer.json (default: the checkpoint's)");
  cmd->add_option("--prompt", o.prompt, "Text to continue");
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate at most");
  cmd->add_option("--temperature", o.sampling.temperature, "Sampling temperature (0: greedy)");
  cmd->add_option("--top-p", o.sampling.top_p, "Nucleus sampling mass");
  cmd->add_option("--seed", o.seed, "Sampling seed");
  cmd->add_option("--adapter", o.adapter,
                  "A PEFT LoRA adapter directory on the checkpoint's weights (default: a LoRA run's own adapter/)");
  cmd->add_option("--precision", o.precision,
                  "Operands of the products: fp32 or bf16 (float accumulation); default: as trained")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->callback([options] {
    run_generate(*options);
  });
}

}  // namespace trillion
