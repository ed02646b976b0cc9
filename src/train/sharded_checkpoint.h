// Sharded checkpoints (`trillion train --sharded-checkpoints` under mpirun): no rank gathers the
// model; each writes its own shard. Beside config.json, trainer_state.json and tokenizer.model
// (rank 0), the checkpoint directory holds
//   shards/rank-RRRRR-of-NNNNN.safetensors  this rank's slices of the parameters and of both AdamW
//                                           moments: 1-D tensors "params.K", "exp_avg.K" and
//                                           "exp_avg_sq.K" for its K-th slice (ShardLayout::slices),
//                                           and of a LoRA base's frozen parameters: "frozen.K" for
//                                           its K-th frozen slice (ShardLayout::frozen_slices)
//   shards/buffers.safetensors              the non-trainable buffers (router biases), "buffers":
//                                           flat [sharded_size, total_size) (rank 0)
//   shards/index.json                       {"format": "trillion-sharded", "ranks", "ep",
//                                            "trainable_size", "sharded_size", "total_size",
//                                            "tensors": [{"name", "offset"}, …] (the flat layout),
//                                            "slices": [{"file", "k", "global", "count"}, …],
//                                            "frozen_slices": the same for the frozen slices}
// (Written before the frozen base was sharded, an index has no sharded_size and the buffers hold
// [trainable_size, total_size), the frozen base included; it reads as before.)
// Flat offsets depend only on the parameter table (checked tensor by tensor on reading), so any
// layout (ranks, ep) and one process read it back; `trillion export` writes it as a Hugging Face layout. It is written like every
// checkpoint (train/checkpoint.h): into rank 0's temporary directory, renamed once every rank's
// file is complete, so a checkpoint is complete or absent.
#pragma once

#include <string>

#include "model/params.h"
#include "parallel/shard_layout.h"

namespace trillion {

bool is_sharded_checkpoint(const std::string& dir);

// DIR/shards/rank-….safetensors of `layout`'s rank: params, exp_avg, exp_avg_sq [shard_size], and
// frozen [frozen_shard_size] (null when that is 0).
template <class T>
void write_checkpoint_shard(const std::string& dir, const ShardLayout& layout, const T* params, const T* exp_avg,
                            const T* exp_avg_sq, const T* frozen);
// Rank 0: DIR/shards/index.json (every rank's slices, from the table) and buffers.safetensors from
// params [total_size] (only its buffer range is read).
template <class T>
void write_checkpoint_index(const std::string& dir, const ParamTable& table, int ranks, int ep, const T* params);

// params [total_size] (every trainable and frozen element and the buffers), and the moments [trainable_size]
// unless null. Errors name the file and what does not match the table.
template <class T>
void read_sharded_checkpoint(const std::string& dir, const ParamTable& table, T* params, T* exp_avg, T* exp_avg_sq);

}  // namespace trillion
