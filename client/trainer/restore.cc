// restore_from_checkpoint (ps/checkpoint.h): a saved model into a new job.
#include "client/table_rows.h"
#include "ps/checkpoint.h"
#include "ps/client.h"

namespace ps {

RestoredModel restore_from_checkpoint(Client& client, const std::string& dir,
                                      const JobConfig* job) {
  RestoredModel m = load_checkpoint(dir);
  // A dynamic table's row limit is per shard: rows of a checkpoint of more
  // shards may not fit this job's. Refused before anything is created.
  for (const auto& t : m.tables)
    check_restore_fits(t.spec, t.ids, static_cast<uint32_t>(client.num_shards()),
                       "restore_from_checkpoint");
  if (job || m.job_configured) {
    JobConfig config = job ? *job : m.job;
    config.start_step = m.global_step;
    client.init_job(config);
  }
  client.create(
      m.tensors);  // placed for this job's shards; values, slots and versions travel along
  if (!m.tables.empty()) {
    std::vector<TableSpec> specs;
    for (const auto& t : m.tables) specs.push_back(t.spec);
    client.create_tables(specs);
    for (const auto& t : m.tables)
      client.restore_rows(t.spec.name, t.ids, t.values, t.slots, t.version, t.ages);
  }
  client.set_ready();
  return m;
}

}  // namespace ps
