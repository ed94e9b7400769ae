// psd: one parameter-server shard.
//
//   psd --port 2222 --shard_index 0 --num_shards 1
//   psd --ps_hosts=h1:2222,h2:2222 --task_index=1     # shard 1 of the cluster
//   TF_CONFIG='{"cluster":{"ps":[...],"worker":[...]},"task":{"type":"ps","index":1}}' psd
//   srun ... psd --slurm_num_ps=2 --port_base=2222      # as the trainers read Slurm
//
// Exits 0 on SIGTERM/SIGINT after finishing the updates in flight.

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/for_people.h"
#include "ps/flag_parsing.h"
#include "ps/errors.h"
#include "server/psd_flags.h"
#include "server/server.h"

int main(int argc, char** argv) {
  CLI::App app{"psd: parameter-server shard daemon (psd/libpsclient " PS_VERSION ")"};
  ps::ServerOptions options;
  ps::PsdFlagValues extra;
  ps::add_psd_flags(app, options, extra);
  PS_PARSE_FLAGS(app, argc, argv);

  try {
    ps::finish_psd_flags(options, extra);
    if (!ps::serve_until_signal(options)) {
      spdlog::error("psd exited without its final checkpoint (exit 3)");
      return 3;
    }
  } catch (const ps::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const kj::Exception& e) {
    spdlog::error("{}", ps::for_people(e.getDescription().cStr()));
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("psd: {}", e.what());
    return 1;
  }
  spdlog::info("psd exited cleanly");
  return 0;
}
