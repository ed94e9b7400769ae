// libFuzzer target over the checkpoint file reader and psd's restore: any
// bytes on disk must give a CheckpointError (or a valid checkpoint, which a
// shard then restores whole or refuses whole), never a crash, a leak or an
// unbounded allocation. Fuzz builds skip the checksums (checkpoint_file.cc),
// so mutations of the seed in fuzz/seeds/checkpoint (a psd checkpoint: four
// optimizers after three pushes, a tensor in two parts, a job config) reach
// the records' parsing:
//   build-fuzz/fuzz/checkpoint_fuzz -max_total_time=600 corpus/ fuzz/seeds/checkpoint
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <spdlog/spdlog.h>

#include "common/checkpoint/checkpoint_file.h"
#include "server/shard.h"
#include "fuzz/shard_env.h"
#include "fuzz/shard_invariants.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/checkpoint_fuzz." + std::to_string(::getpid()) + ".psckpt";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  ps::ShardCheckpoint c;
  try {
    c = ps::read_checkpoint(path);
  } catch (const ps::Error&) {
    return 0;
  }
  // A file that reads back is restored into a shard as psd restores it at
  // start: it holds every tensor but those named as left out, or refuses
  // the file and holds none; what it holds passes the live requests' checks
  // (shard_invariants.h), and so does its job.
  ps::ShardOptions options;
  options.shard_index = c.shard_index;
  options.num_shards = c.num_shards;
  options.limits.max_tensor_bytes = 1 << 20;
  options.limits.max_total_bytes = 8 << 20;
  options.limits.max_tensors = 64;
  ps::Shard shard(options, ps::fuzz::pool(), ps::fuzz::timer());
  try {
    const auto skipped = shard.restore(c);
    if (shard.store().count() + skipped.size() != c.tensors.size()) __builtin_trap();
    if (shard.job().configured()) ps::validate_job_config(shard.job().config());
    ps::fuzz::check_shard_invariants(shard);
  } catch (const ps::Error&) {
    if (shard.store().count() != 0) __builtin_trap();
  }
  return 0;
}
