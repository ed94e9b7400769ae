// A worker process for the multi-process integration test: pushes a constant
// gradient N times to tensor "shared" or, with --rows, to every row of table
// "rows" (512 rows of 8 floats: 16 KiB a push, the shared memory threshold).
#include <numeric>

#include <CLI/CLI.hpp>

#include "ps/client.h"

int main(int argc, char** argv) {
  CLI::App app{"push_worker"};
  std::string host;
  int pushes = 100;
  float value = 1;
  bool rows = false;
  app.add_option("--ps_hosts", host)->required();
  app.add_option("--pushes", pushes);
  app.add_option("--value", value);
  app.add_flag("--rows", rows, "push table rows instead of a tensor");
  CLI11_PARSE(app, argc, argv);
  ps::ClientOptions o;
  o.ps_hosts = {host};
  ps::Client client(o);
  if (rows) {
    client.create_tables(
        {{.name = "rows", .dim = 8, .rows = 512, .optimizer = ps::RowOptimizerConfig::sgd(1.0f)}});
    std::vector<int64_t> ids(512);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<float> g(512 * 8, value);
    for (int i = 0; i < pushes; ++i) client.push_rows("rows", ids, g);
    return 0;
  }
  client.create({{.name = "shared", .shape = {4096}, .optimizer = ps::OptimizerConfig::sgd(1.0f)}});
  std::vector<float> g(4096, value);
  for (int i = 0; i < pushes; ++i) client.push("shared", g);
  return 0;
}
