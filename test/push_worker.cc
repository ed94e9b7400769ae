// A worker process for the multi-process integration test: pushes a constant
// gradient N times to tensor "shared".
#include <CLI/CLI.hpp>

#include "ps/client.h"

int main(int argc, char** argv) {
  CLI::App app{"push_worker"};
  std::string host;
  int pushes = 100;
  float value = 1;
  app.add_option("--ps_hosts", host)->required();
  app.add_option("--pushes", pushes);
  app.add_option("--value", value);
  CLI11_PARSE(app, argc, argv);
  ps::ClientOptions o;
  o.ps_hosts = {host};
  ps::Client client(o);
  client.create({{.name = "shared", .shape = {4096}, .optimizer = ps::OptimizerConfig::sgd(1.0f)}});
  std::vector<float> g(4096, value);
  for (int i = 0; i < pushes; ++i) client.push("shared", g);
  return 0;
}
