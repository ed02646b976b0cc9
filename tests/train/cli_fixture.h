// Shared fixture of the train/eval/generate CLI tests: runs build/trillion, and builds once per
// test process a tiny tokenized corpus (made with `trillion tokenize`), a second one with a
// different tokenizer of the same vocab size, a tiny model config matching the data, and one
// trained run that the checkpoint, eval and generate tests inspect.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/shards.h"
#include "io/safetensors.h"
#include "test_support/command.h"
#include "test_support/scratch_dir.h"

extern char** environ;

namespace trillion::train_test {

namespace fs = std::filesystem;

// The one command runner (test_support/command.h): CommandResult{status, output} and run_shell.
using test::CommandResult;
using test::run_shell;

// Two OpenMP threads that sleep rather than spin while waiting (same results, far less CPU burnt on
// a busy machine).
inline const std::string kTwoThreads = "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive";

// Runs `env TRILLION_BINARY args` through the shell; stderr is captured too unless stdout_only.
// One OpenMP thread unless `env` says otherwise: the tiny models gain nothing from more, and on a
// loaded machine idle-spinning threads slow such runs down many times.
inline CommandResult run_cli(const std::string& args, const std::string& env = "OMP_NUM_THREADS=1",
                             bool stdout_only = false) {
  return run_shell(env + " " + TRILLION_BINARY + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1"));
}

// Starts the trillion binary with `args` (split at spaces) in the background, its output appended
// to `log`, behind `launcher` if given (such as "mpirun -np 2"); returns its pid (-1 if it could
// not start). For tests that signal or kill a run.
inline pid_t spawn_trillion(const std::string& args, const fs::path& log, const std::string& launcher = "") {
  std::vector<std::string> words;
  std::istringstream in(launcher + " " + TRILLION_BINARY + " " + args);
  for (std::string word; in >> word;) words.push_back(word);
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int error = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return error == 0 ? pid : -1;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::vector<nlohmann::json> read_metrics(const fs::path& out_dir) {
  std::vector<nlohmann::json> records;
  std::istringstream in(read_text(out_dir / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// The JSON object on the last line of a command's output (eval's summary).
inline nlohmann::json last_json_line(const std::string& output) {
  const size_t end = output.find_last_not_of('\n');
  const size_t begin = output.rfind('\n', end);
  return nlohmann::json::parse(output.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin + 1)));
}

// Paragraphs of random sentences over a small vocabulary of words.
inline std::string make_corpus(const std::vector<std::string>& words, uint64_t seed, int paragraphs) {
  const CounterRng rng(seed, "train-test-corpus");
  uint64_t counter = 0;
  std::string text;
  for (int p = 0; p < paragraphs; ++p) {
    for (int s = 0; s < 3; ++s) {
      const int length = 4 + static_cast<int>(rng.bits(counter++) % 6);
      for (int w = 0; w < length; ++w) {
        text += words[rng.bits(counter++) % words.size()];
        text += w + 1 < length ? " " : ".\n";
      }
    }
    text += "\n";
  }
  return text;
}

struct TestData {
  fs::path root;
  fs::path data_dir;        // tokenized corpus
  fs::path other_data_dir;  // another corpus and tokenizer, same vocab size
  fs::path config_path;     // tiny model whose vocab matches data_dir
  fs::path small_vocab_config_path;  // the same model with vocab_size 64
  int64_t vocab_size = 0;
};

inline void write_config(const fs::path& path, int64_t vocab_size) {
  const nlohmann::json config = {{"model_type", "qwen3"},       {"vocab_size", vocab_size},
                                 {"hidden_size", 16},           {"intermediate_size", 24},
                                 {"num_hidden_layers", 2},      {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2},    {"head_dim", 4},
                                 {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-6},
                                 {"rope_theta", 10000.0},       {"initializer_range", 0.02},
                                 {"tie_word_embeddings", false}};
  write_text(path, config.dump(2));
}

// The directory of this test process's data and runs: a ScratchDir made on first use and removed
// when the test program ends.
inline fs::path test_root() {
  static const test::ScratchDir dir("train_test");
  return dir.path();
}

// The session directory of this test process's mpiruns (a ScratchDir like test_root()). OpenMPI
// 4.1's mpiruns otherwise share /tmp/ompi.HOST.UID/, and one that ends removes it while a
// concurrent one (ctest -j2) is creating its pid.N inside: "A call to mkdir was unable to create
// the desired directory".
inline fs::path mpi_session_root() {
  static const test::ScratchDir dir("ompi");
  return dir.path();
}

// `mpirun -np ranks` with one OpenMP thread per rank, root and more ranks than cores allowed, and its
// own session directory; a command prefix without quotes (spawn_trillion splits it at spaces).
inline std::string mpirun_launcher(int ranks) {
  return std::string(TRILLION_MPIEXEC) + " --oversubscribe --allow-run-as-root --mca orte_tmpdir_base " +
         mpi_session_root().string() + " -np " + std::to_string(ranks) + " -x OMP_NUM_THREADS=1";
}

inline const TestData& test_data() {
  static const TestData data = [] {
    TestData d;
    d.root = test_root();
    const std::vector<std::string> words = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "big",
                                            "red", "house", "and", "then", "slept", "under", "tree", "small",
                                            "bird", "sang", "in", "morning", "light", "river", "flows"};
    const std::vector<std::string> other_words = {"quartz", "jumbo", "vex", "wizard", "fjord", "glyph", "nymph",
                                                  "crypt", "lynx", "sphinx", "zephyr", "jinx", "blitz", "quip"};
    write_text(d.root / "corpus.txt", make_corpus(words, 1, 300));
    write_text(d.root / "other.txt", make_corpus(other_words, 2, 300));
    d.data_dir = d.root / "data";
    d.other_data_dir = d.root / "other_data";
    for (const auto& [input, out] : {std::pair{d.root / "corpus.txt", d.data_dir},
                                     std::pair{d.root / "other.txt", d.other_data_dir}}) {
      const CommandResult r =
          run_cli("tokenize --input " + input.string() + " --out " + out.string() + " --vocab-size 300");
      if (r.status != 0) throw std::runtime_error("tokenize failed: " + r.output);
    }
    d.vocab_size = read_token_shard((d.data_dir / "train.bin").string()).vocab_size;
    d.config_path = d.root / "tiny.json";
    write_config(d.config_path, d.vocab_size);
    d.small_vocab_config_path = d.root / "tiny_vocab64.json";
    write_config(d.small_vocab_config_path, 64);
    return d;
  }();
  return data;
}

// A config from configs/models with the test corpus's vocab and the given fields changed (null:
// none), written into the test root; returns its path.
inline fs::path config_with(const std::string& name, const nlohmann::json& changes) {
  nlohmann::json config = nlohmann::json::parse(read_text(fs::path(TRILLION_SOURCE_DIR) / "configs/models" / (name + ".json")));
  config["vocab_size"] = test_data().vocab_size;
  if (!changes.is_null()) config.update(changes);
  const std::string variant = std::to_string(std::hash<std::string>{}(changes.dump()));
  const fs::path out = test_data().root / (name + "_" + variant + ".json");
  write_text(out, config.dump(2));
  return out;
}

// Two weight files, tensor by tensor, within `tolerance` relative to the reference's largest.
inline void expect_same_tensors(const fs::path& file, const fs::path& reference, double tolerance) {
  const SafetensorsReader a(file.string()), b(reference.string());
  for (const auto& [name, info] : b.tensors()) {
    int64_t elements = 1;
    for (const int64_t d : info.shape) elements *= d;
    std::vector<double> x(elements), y(elements);
    a.read(name, info.shape, x.data());
    b.read(name, info.shape, y.data());
    double largest = 0.0, difference = 0.0;
    for (size_t i = 0; i < y.size(); ++i) largest = std::max(largest, std::abs(y[i]));
    for (size_t i = 0; i < y.size(); ++i) difference = std::max(difference, std::abs(x[i] - y[i]));
    EXPECT_LE(difference, tolerance * std::max(largest, 1e-30)) << name;
  }
}

// A small sgemm for the MFU ceiling, so that each tiny run does not spend seconds timing 2048³.
inline const std::string kSmallMfuGemm = " --mfu-gemm-size 128";

// Common flags of the tiny runs.
inline std::string tiny_run_flags(const fs::path& out_dir) {
  const TestData& d = test_data();
  return "--config " + d.config_path.string() + " --data " + d.data_dir.string() + " --out " + out_dir.string() +
         " --batch 2 --seq-len 16 --lr 1e-2 --warmup 4 --log-every 10" + kSmallMfuGemm;
}

// One 40-step run with checkpoints every 10 steps and evaluation every 20, made once.
inline const fs::path& trained_run() {
  static const fs::path out = [] {
    const fs::path dir = test_data().root / "trained";
    const CommandResult r = run_cli("train " + tiny_run_flags(dir) + " --steps 40 --save-every 10 --eval-every 20");
    if (r.status != 0) throw std::runtime_error("train failed: " + r.output);
    return dir;
  }();
  return out;
}

}  // namespace trillion::train_test
