// run_evaluator (ps/evaluator.h): new parameters from checkpoints or psd, one
// evaluation each, until the job's last ones.
#include "ps/evaluator.h"

#include <sys/stat.h>

#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/checkpoint/checkpoint_file.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/errors.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// Between looks, says every kSayEvery what it waits for (as every wait does:
// docs/first-hour.md).
constexpr auto kSayEvery = std::chrono::seconds(5);

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One look at the checkpoints: a snapshot when one newer than `after` is
// complete and holds every tensor of `names` (a checkpoint from before the
// chief created the model holds none). `seen`: the newest step looked at.
std::optional<ParameterSnapshot> from_checkpoint(const std::string& dir,
                                                 const std::vector<std::string>& names,
                                                 int64_t& seen) {
  const std::optional<int64_t> newest = newest_checkpoint_step(dir);
  if (!newest || *newest <= seen) return std::nullopt;
  RestoredModel m = load_checkpoint(dir);
  if (m.global_step <= seen) return std::nullopt;  // the newest files were unreadable
  seen = m.global_step;
  ParameterSnapshot s;
  s.global_step = m.global_step;
  s.final = m.job_configured && m.job.train_steps > 0 && m.global_step >= m.job.train_steps;
  for (TensorSpec& t : m.tensors) s.tensors.emplace(t.name, std::move(t.init.values));
  for (const std::string& name : names) {
    if (!s.tensors.contains(name)) {
      spdlog::info("checkpoint of step {} has no tensor '{}' (the model was not created yet?)",
                   m.global_step, name);
      return std::nullopt;
    }
  }
  return s;
}

// One look at psd: a snapshot when its global step passed `after`, or the
// job finished (its final parameters, even at the same step).
std::optional<ParameterSnapshot> from_psd(Client& client, const std::vector<std::string>& names,
                                          std::map<std::string, uint64_t>& sizes, int64_t after) {
  const std::vector<ShardStats> stats = client.stats();
  if (stats.empty() || !stats.front().ready) return std::nullopt;  // no model yet
  const bool finished = stats.front().finished;
  if (stats.front().global_step <= after && !finished) return std::nullopt;
  if (sizes.empty()) {
    // Placed as the chief placed them: the same tensors in the same order.
    std::map<std::string, std::vector<uint64_t>> shapes;
    for (const TensorInfo& t : client.list()) shapes[t.name] = t.shape;
    std::vector<TensorSpec> specs;
    for (const std::string& name : names) {
      auto it = shapes.find(name);
      if (it == shapes.end()) return std::nullopt;  // not created yet: look again next time
      specs.push_back(TensorSpec{.name = name, .shape = it->second});
    }
    client.declare(specs);
    for (const TensorSpec& t : specs) sizes[t.name] = t.num_elements();
  }
  ParameterSnapshot s;
  std::vector<std::span<float>> outs;
  for (const std::string& name : names) {
    auto it = sizes.find(name);
    std::vector<float>& values = s.tensors[name];
    values.assign(it->second, 0.0f);
    outs.emplace_back(values);
  }
  const PullResult r = client.pull(names, outs);
  if (r.step <= after && !finished) return std::nullopt;
  s.global_step = r.step;
  s.final = finished;
  return s;
}

}  // namespace

std::optional<int64_t> newest_checkpoint_step(const std::string& dir) {
  // (shard count, step) -> shards with a file of that step.
  std::map<std::pair<uint32_t, int64_t>, std::set<uint32_t>> sets;
  for (const CheckpointFile& f : list_all_checkpoints(dir))
    sets[{f.num_shards, f.step}].insert(f.shard_index);
  std::optional<int64_t> newest;
  for (const auto& [key, shards] : sets) {
    if (shards.size() == key.first && (!newest || key.second > *newest)) newest = key.second;
  }
  return newest;
}

EvaluatorResult run_evaluator(const EvaluatorOptions& o,
                              const std::function<void(const ParameterSnapshot&)>& evaluate) {
  const bool checkpoints = !o.checkpoint_dir.empty();
  if (!checkpoints && o.client == nullptr)
    throw ConfigError(o.who +
                      ": give a checkpoint directory or the ps hosts to read the model from");
  if (o.tensors.empty()) throw ConfigError(o.who + ": no tensors named to evaluate");
  const std::string source =
      checkpoints ? "checkpoints in " + o.checkpoint_dir : std::string("the parameters on psd");
  spdlog::info(
      "{}: evaluating {} as they change, looking every {} s; stops after the job's last "
      "step, or after {} s with nothing new",
      o.who, source, secs(o.interval), secs(o.timeout));
  EvaluatorResult r;
  std::map<std::string, uint64_t> sizes;
  int64_t seen = -1;  // the newest checkpoint step looked at
  auto last_new = Clock::now(), last_said = Clock::now();
  for (;;) {
    std::optional<ParameterSnapshot> s;
    if (checkpoints) {
      s = from_checkpoint(o.checkpoint_dir, o.tensors, seen);
    } else {
      try {
        s = from_psd(*o.client, o.tensors, sizes, r.last_step);
      } catch (const ConnectionError& e) {
        // psd exits once the job finished and its workers left.
        if (r.evaluations == 0) throw;
        r.stopped_because =
            "psd went away (" + std::string(e.what()) + "); psd exits once the job is done";
        return r;
      }
    }
    if (s && s->final && s->global_step == r.last_step) {
      // Pulled at the last step while the chief was still finishing: done already.
      r.saw_final = true;
      r.stopped_because = "evaluated the job's last parameters (global step " +
                          std::to_string(s->global_step) + ")";
      return r;
    }
    if (s) {
      evaluate(*s);
      ++r.evaluations;
      r.last_step = s->global_step;
      last_new = last_said = Clock::now();
      if (s->final) {
        r.saw_final = true;
        r.stopped_because = "evaluated the job's last parameters (global step " +
                            std::to_string(s->global_step) + ")";
        return r;
      }
    }
    const auto now = Clock::now();
    if (now - last_new >= o.timeout) {
      r.stopped_because = "nothing new for " + fmt::format("{:.0f}", secs(now - last_new)) +
                          " s (the timeout): stopping";
      return r;
    }
    if (now - last_said >= kSayEvery) {
      const std::string after = " newer than global step " + std::to_string(r.last_step);
      std::string what;
      struct stat st {};
      if (!checkpoints) {
        what = r.last_step < 0 ? "the model on psd (the chief creates it)"
                               : "psd's step to pass global step " + std::to_string(r.last_step);
      } else if (::stat(o.checkpoint_dir.c_str(), &st) != 0) {
        what = "the first checkpoint in " + o.checkpoint_dir +
               " (it does not exist yet: the ps tasks' --checkpoint_dir?)";
      } else {
        what = (r.last_step < 0 ? "the first checkpoint in " : "a checkpoint in ") +
               o.checkpoint_dir + (r.last_step < 0 ? "" : after);
      }
      spdlog::info("{}: waiting for {} ({:.0f} s of {:.0f} s)", o.who, what, secs(now - last_new),
                   secs(o.timeout));
      last_said = now;
    }
    std::this_thread::sleep_for(o.interval);
  }
}

}  // namespace ps
