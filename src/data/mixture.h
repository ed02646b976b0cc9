// Data mixtures: `--data A:0.7,B:0.3` trains on several data directories (data/shards.h) with
// weights, deterministically and resumably.
//
// A spec is a comma-separated list of DIR or DIR:WEIGHT (weight > 0, default 1; weights are
// normalized). Every directory must use the same tokenizer (same hash). With one directory the
// mixture is exactly that directory's Sampler (seed S), so a plain `--data DIR` run is unchanged.
// With several, window p of the run (p = 0, 1, … over the whole run) comes from the source i whose
// cumulative weight range holds CounterRng(S, "data.mixture").uniform(p); source i keeps its own
// Sampler (seed CounterRng(S, "data.mixture.seed").bits(i)) and position. The state is the run's
// position and each source's position; both are saved in checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "data/shards.h"

namespace trillion {

struct DataSource {
  std::string directory;
  double weight = 1.0;  // as given (not normalized)
};

// Parses a spec; errors name the item and what was expected.
std::vector<DataSource> parse_data_mixture(const std::string& spec);
// The spec of `sources` with absolute directories (what trainer_state.json stores).
std::string format_data_mixture(const std::vector<DataSource>& sources);

struct DataMixture {
  std::vector<DataSource> sources;
  std::vector<DataDir> dirs;  // [sources]
  std::vector<double> weights;  // [sources] normalized to sum 1
  const DataDir& first() const { return dirs.front(); }  // its tokenizer is every source's
  int64_t train_tokens() const;
  // One source: its train checksum; several: FNV-1a 64 of (checksum, weight) per source.
  uint64_t train_checksum() const;
  TokenStreams val_streams() const;  // every source's val split, in order
};

// Opens every directory (open_data_dir) and checks that they share one tokenizer.
DataMixture open_data_mixture(const std::string& spec, int64_t expected_vocab);

class MixtureSampler {
 public:
  MixtureSampler(const DataMixture& mixture, int64_t seq_len, uint64_t seed);
  // Fills inputs[batch, seq_len] and targets[batch, seq_len] with the next `batch` windows.
  void next_batch(int32_t* inputs, int32_t* targets, int64_t batch);
  int64_t position() const { return position_; }  // windows handed out in the run
  std::vector<int64_t> source_positions() const;  // [sources] windows each source handed out
  // Restores a saved state; source_positions must have one entry per source summing to position
  // (may be empty for one source, or at position 0). Errors name what does not match.
  void set_positions(int64_t position, const std::vector<int64_t>& source_positions);
  int64_t windows_per_epoch() const;  // Σ over sources

 private:
  int source_of(int64_t position) const;
  std::vector<Sampler> samplers_;
  std::vector<double> cumulative_;  // [sources] upper ends of the weight ranges
  uint64_t seed_;
  int64_t seq_len_;
  int64_t position_ = 0;
};

}  // namespace trillion
