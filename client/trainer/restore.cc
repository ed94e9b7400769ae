// restore_from_checkpoint (ps/checkpoint.h): a saved model into a new job.
#include "ps/checkpoint.h"
#include "ps/client.h"

namespace ps {

RestoredModel restore_from_checkpoint(Client& client, const std::string& dir, const JobConfig* job) {
  RestoredModel m = load_checkpoint(dir);
  if (job || m.job_configured) {
    JobConfig config = job ? *job : m.job;
    config.start_step = m.global_step;
    client.init_job(config);
  }
  client.create(m.tensors);  // placed for this job's shards; values, slots and versions travel along
  client.set_ready();
  return m;
}

}  // namespace ps
