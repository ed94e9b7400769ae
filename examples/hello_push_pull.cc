// The smallest libpsclient program: create a 2x2 weight `w` and a bias `b`
// on the ps shards, push a gradient and pull the result.
//
//   build/server/psd --port 2222 &
//   build/examples/hello_push_pull --ps_hosts=127.0.0.1:2222
#include <cstdio>

#include <CLI/CLI.hpp>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/trainer_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"hello_push_pull: create, push and pull two tensors on psd"};
  std::string ps_hosts = "127.0.0.1:2222";
  float lr = 0.5f;
  app.add_option("--ps_hosts", ps_hosts, "comma-separated ps host:port list")
      ->capture_default_str();
  app.add_option("--learning_rate", lr, "SGD learning rate")->capture_default_str();
  std::string tls_ca;
  app.add_option("--tls_ca", tls_ca, "TLS to psds started with --tls_cert: their CA's PEM file");
  PS_PARSE_FLAGS(app, argc, argv);

  try {
    ps::ClientOptions options;
    options.ps_hosts = ps::split_list(ps_hosts);
    options.tls_ca = tls_ca;
    ps::Client client(options);
    client.create({
        {.name = "w",
         .shape = {2, 2},
         .optimizer = ps::OptimizerConfig::sgd(lr),
         .init = ps::InitConfig::from_values({1, 2, 3, 4})},
        {.name = "b",
         .shape = {2},
         .optimizer = ps::OptimizerConfig::sgd(lr),
         .init = ps::InitConfig::constant(0.5f)},
    });

    std::vector<float> w(4), b(2);
    client.pull({"w", "b"}, {w, b});
    std::printf("initial  w = [%g %g; %g %g]  b = [%g %g]\n", w[0], w[1], w[2], w[3], b[0], b[1]);

    const std::vector<float> gw = {1, 1, 1, 1}, gb = {1, -1};
    client.push({"w", "b"}, {gw, gb});
    auto result = client.pull({"w", "b"}, {w, b});
    std::printf("after one push of grad (1, 1, 1, 1) and (1, -1) with lr %g:\n", lr);
    std::printf("         w = [%g %g; %g %g]  b = [%g %g]  (versions %llu, %llu)\n", w[0], w[1],
                w[2], w[3], b[0], b[1], static_cast<unsigned long long>(result.versions[0]),
                static_cast<unsigned long long>(result.versions[1]));
    for (const auto& t : client.list()) {
      std::printf("  %-4s shape %-8s on shard %d, version %llu\n", t.name.c_str(),
                  ps::shape_to_string(t.shape).c_str(), t.shards.at(0),
                  static_cast<unsigned long long>(t.version));
    }
  } catch (const ps::Error& e) {
    std::fprintf(stderr, "hello_push_pull: %s\n", e.what());
    return 1;
  }
  return 0;
}
