// libFuzzer target over the checkpoint file reader: any bytes on disk must
// give a CheckpointError (or a valid checkpoint), never a crash, a leak or
// an unbounded allocation.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <spdlog/spdlog.h>

#include "checkpoint_file.h"

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
  try {
    ps::ShardCheckpoint c = ps::read_checkpoint(path);
    (void)c;
  } catch (const ps::Error&) {
  }
  return 0;
}
