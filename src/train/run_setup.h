// A training run's set-up before its first step: the settings checked, the config, data, weights
// and trainer state resolved for a fresh, --init or --resume run (what a resumed run may change and
// what it must keep), and the output directory created.
#pragma once

#include <string>

#include "data/mixture.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace trillion {

struct RunSetup {
  ModelConfig config;
  DataMixture data;
  std::string weights_dir;  // checkpoint or weights to load; empty: seeded initialization
  bool resumed = false;
  TrainerState state;       // settings and, when resumed, the saved progress
};

// Fails with the flag named when a setting is out of range (or does not fit the ranks).
void validate_settings(const TrainSettings& s);

// Resolves config, data, weights and settings for a fresh, --init or --resume run.
RunSetup prepare_run(TrainOptions& o);

}  // namespace trillion
