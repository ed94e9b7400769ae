// Restoring a model from psd checkpoints, possibly into a job with another
// number of shards.
//
// Every psd started with --checkpoint_dir writes its own tensors to
// <dir>/shard-<i>-of-<n>/ckpt-<step>.psckpt (see checkpoint/checkpoint_file.h).
// A restarted psd with the same shard layout restores its own files by itself.
// To move a model to a job with a different shard count, the chief reads all
// shards' files of the newest step every shard has, reassembles the logical
// tensors (values, optimizer slots, update counts) and creates them in the
// new job, which places them for its own shards:
//
//   ps::Client chief(opts);                                  // M shards
//   ps::RestoredModel m = ps::load_checkpoint("/ckpt");      // written by N shards
//   ps::JobConfig job = m.job;  job.start_step = m.global_step;
//   chief.init_job(job);
//   chief.create(m.tensors);                                 // values, slots, version
//   chief.set_ready();
//
// (TrainingSession does this when SessionOptions::restore_from is set.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ps/embedding.h"
#include "ps/errors.h"
#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

// A checkpoint file that is not valid (bad magic or version, checksum
// mismatch, truncated); the message names the file and what is wrong.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// An embedding table's rows from all shards of a checkpoint (a dynamic
// table: the rows that existed).
struct RestoredTable {
  TableSpec spec;
  uint64_t version = 0;  // most updates any shard had applied
  std::vector<int64_t> ids;
  std::vector<float> values;              // ids.size() * dim, row i at values[i * dim]
  std::vector<std::vector<float>> slots;  // the optimizer's slots, laid out as values
  // Rows that expire: per row, the steps since its last touch (empty where
  // the table's rows do not expire, or the files carried none).
  std::vector<uint32_t> ages;
};

struct RestoredModel {
  int64_t global_step = 0;  // the step the checkpoint was taken at
  bool job_configured = false;
  JobConfig job;                   // the job configuration saved with it
  uint32_t num_shards = 0;         // how many shards wrote it
  std::vector<std::string> files;  // the files read, shard by shard
  // Whole logical tensors: init = their values, slots and version set.
  std::vector<TensorSpec> tensors;
  std::vector<RestoredTable> tables;
};

// Reads the newest step for which every shard of the checkpoint under `dir`
// has a valid file; invalid files are logged and older steps tried. Throws
// CheckpointError when there is none.
RestoredModel load_checkpoint(const std::string& dir);

class Client;
// Chief, for a new job: load_checkpoint(dir), then on every shard of
// `client`: initJob (the saved job configuration, or `job` when given, with
// start_step = the checkpoint's step), create all its tensors and tables
// (rows moved to the shards this job places them on), setReady.
RestoredModel restore_from_checkpoint(Client& client, const std::string& dir,
                                      const JobConfig* job = nullptr);

}  // namespace ps
