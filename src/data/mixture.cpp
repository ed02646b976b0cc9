// Weighted, resumable sampling from several data directories. See mixture.h.
#include "data/mixture.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace trillion {

std::vector<DataSource> parse_data_mixture(const std::string& spec) {
  std::vector<DataSource> sources;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = spec.find(',', begin);
    const std::string item = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    begin = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (item.empty()) fail("--data \"", spec, "\": an empty item (expected DIR or DIR:WEIGHT, separated by commas)");
    DataSource source{item, 1.0};
    const size_t colon = item.rfind(':');
    if (colon != std::string::npos) {
      const std::string weight = item.substr(colon + 1);
      char* end = nullptr;
      const double value = std::strtod(weight.c_str(), &end);
      if (weight.empty() || end != weight.c_str() + weight.size() || !(value > 0.0) || !std::isfinite(value))
        fail("--data \"", spec, "\": weight \"", weight, "\" of ", item.substr(0, colon), " (expected a positive number)");
      source = {item.substr(0, colon), value};
    }
    if (source.directory.empty()) fail("--data \"", spec, "\": item \"", item, "\" names no directory");
    sources.push_back(source);
  }
  return sources;
}

std::string format_data_mixture(const std::vector<DataSource>& sources) {
  std::string spec;
  for (const DataSource& source : sources) {
    if (!spec.empty()) spec += ",";
    spec += std::filesystem::absolute(source.directory).lexically_normal().string();
    if (sources.size() > 1) {
      char weight[32];
      std::snprintf(weight, sizeof(weight), ":%.17g", source.weight);
      spec += weight;
    }
  }
  return spec;
}

int64_t DataMixture::train_tokens() const {
  int64_t tokens = 0;
  for (const DataDir& dir : dirs) tokens += dir.train.token_count();
  return tokens;
}

uint64_t DataMixture::train_checksum() const {
  if (dirs.size() == 1) return dirs.front().train.checksum;
  std::string bytes;
  for (size_t i = 0; i < dirs.size(); ++i) {
    bytes.append(reinterpret_cast<const char*>(&dirs[i].train.checksum), sizeof(uint64_t));
    bytes.append(reinterpret_cast<const char*>(&sources[i].weight), sizeof(double));
  }
  return hash_name(bytes);
}

TokenStreams DataMixture::val_streams() const {
  TokenStreams streams;
  for (const DataDir& dir : dirs) {
    const TokenStreams own = dir.val.streams();
    streams.insert(streams.end(), own.begin(), own.end());
  }
  return streams;
}

DataMixture open_data_mixture(const std::string& spec, int64_t expected_vocab) {
  DataMixture mixture;
  mixture.sources = parse_data_mixture(spec);
  double total = 0.0;
  for (const DataSource& source : mixture.sources) {
    mixture.dirs.push_back(open_data_dir(source.directory, expected_vocab));
    total += source.weight;
    const DataDir& first = mixture.dirs.front();
    if (mixture.dirs.back().train.tokenizer_hash != first.train.tokenizer_hash) {
      fail(mixture.dirs.back().tokenizer_path, ": a different tokenizer from ", first.tokenizer_path,
           " (every directory of a --data mixture must use the same tokenizer)");
    }
  }
  for (const DataSource& source : mixture.sources) mixture.weights.push_back(source.weight / total);
  return mixture;
}

MixtureSampler::MixtureSampler(const DataMixture& mixture, int64_t seq_len, uint64_t seed)
    : seed_(seed), seq_len_(seq_len) {
  const CounterRng seeds(seed, "data.mixture.seed");
  const bool one = mixture.dirs.size() == 1;
  double cumulative = 0.0;
  for (size_t i = 0; i < mixture.dirs.size(); ++i) {
    samplers_.emplace_back(mixture.dirs[i].train.streams(), seq_len, one ? seed : seeds.bits(i));
    cumulative += mixture.weights[i];
    cumulative_.push_back(cumulative);
  }
  cumulative_.back() = 1.0;  // rounding: every draw lands in some range
}

int MixtureSampler::source_of(int64_t position) const {
  if (samplers_.size() == 1) return 0;
  const double u = CounterRng(seed_, "data.mixture").uniform(static_cast<uint64_t>(position));
  int source = 0;
  while (u >= cumulative_[source]) ++source;
  return source;
}

void MixtureSampler::next_batch(int32_t* inputs, int32_t* targets, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    samplers_[source_of(position_++)].next_batch(inputs + b * seq_len_, targets + b * seq_len_, 1);
  }
}

std::vector<int64_t> MixtureSampler::source_positions() const {
  std::vector<int64_t> positions;
  for (const Sampler& sampler : samplers_) positions.push_back(sampler.position());
  return positions;
}

void MixtureSampler::set_positions(int64_t position, const std::vector<int64_t>& source_positions) {
  if (source_positions.empty() && (samplers_.size() == 1 || position == 0)) {  // one source, or a fresh run
    for (Sampler& sampler : samplers_) sampler.set_position(0);
    samplers_.front().set_position(position);
    position_ = position;
    return;
  }
  if (source_positions.size() != samplers_.size())
    fail("sampler state: ", source_positions.size(), " source positions for a mixture of ", samplers_.size(),
         " directories");
  const int64_t sum = std::accumulate(source_positions.begin(), source_positions.end(), int64_t{0});
  if (sum != position) fail("sampler state: source positions sum to ", sum, ", not the position ", position);
  for (size_t i = 0; i < samplers_.size(); ++i) {
    if (source_positions[i] < 0) fail("sampler state: source position ", source_positions[i], " is negative");
    samplers_[i].set_position(source_positions[i]);
  }
  position_ = position;
}

int64_t MixtureSampler::windows_per_epoch() const {
  int64_t windows = 0;
  for (const Sampler& sampler : samplers_) windows += sampler.windows_per_epoch();
  return windows;
}

}  // namespace trillion
