#include "shard.h"

#include <cmath>
#include <set>

#include "ps/errors.h"
#include "wire_convert.h"

namespace ps {
namespace {

void to_wire_meta(const StoredTensor& t, bool created, wire::TensorMeta::Builder out) {
  out.setName(t.spec().name);
  auto shape = out.initShape(static_cast<unsigned>(t.spec().shape.size()));
  for (unsigned i = 0; i < t.spec().shape.size(); ++i) shape.set(i, t.spec().shape[i]);
  out.setVersion(t.version());
  out.setOptimizer(static_cast<wire::OptimizerKind>(t.spec().optimizer.kind));
  out.setTrainable(t.spec().trainable);
  out.setCreated(created);
  if (const auto& p = t.part()) {
    auto w = out.initPart();
    w.setFullName(p->full_name);
    auto fs = w.initFullShape(static_cast<unsigned>(p->full_shape.size()));
    for (unsigned i = 0; i < p->full_shape.size(); ++i) fs.set(i, p->full_shape[i]);
    w.setOffset(p->offset);
    w.setIndex(p->index);
    w.setCount(p->count);
  }
}

std::optional<PartMeta> part_from_wire(wire::TensorSpec::Reader spec) {
  if (!spec.hasPart()) return std::nullopt;
  auto p = spec.getPart();
  return PartMeta{p.getFullName(), shape_from_wire(p.getFullShape()), p.getOffset(), p.getIndex(), p.getCount()};
}

bool all_finite(std::span<const float> v) {
  // Summing x - x is NaN exactly when some x is NaN or Inf, and vectorises.
  float acc = 0.0f;
  for (float x : v) acc += x - x;
  return acc == 0.0f;
}

}  // namespace

Shard::Shard(ShardOptions options, ComputePool& pool)
    : options_(std::move(options)), pool_(pool), store_(options_.limits) {}

void Shard::create(wire::Shard::CreateParams::Reader params, wire::Shard::CreateResults::Builder results) {
  auto specs = params.getSpecs();
  // Validate everything first, so a bad spec in a batch creates nothing.
  std::vector<std::pair<TensorSpec, std::optional<PartMeta>>> parsed;
  std::set<std::string> names;
  for (auto s : specs) {
    parsed.emplace_back(from_wire(s), part_from_wire(s));
    if (!names.insert(parsed.back().first.name).second) {
      throw RequestError("create: tensor '" + parsed.back().first.name + "' appears twice in one request");
    }
    store_.validate(parsed.back().first, parsed.back().second);
  }
  auto out = results.initTensors(specs.size());
  for (unsigned i = 0; i < parsed.size(); ++i) {
    auto [tensor, created] = store_.create(parsed[i].first, parsed[i].second);
    to_wire_meta(*tensor, created, out[i]);
  }
  counters_.creates += specs.size();
}

kj::Promise<void> Shard::wait_for_step(int64_t step) {
  if (step <= global_step_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  step_waiters_.emplace(step, kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

kj::Promise<void> Shard::pull(wire::Shard::PullParams::Reader params, wire::Shard::PullResults::Builder results) {
  auto names = params.getNames();
  std::vector<StoredTensor*> tensors;
  tensors.reserve(names.size());
  for (auto n : names) tensors.push_back(&store_.get(n));

  return wait_for_step(params.getMinStep()).then([this, tensors = std::move(tensors), results]() mutable {
    auto out = results.initTensors(static_cast<unsigned>(tensors.size()));
    results.setStep(global_step_);
    kj::Vector<kj::Promise<void>> copies;
    uint64_t bytes = 0;
    for (unsigned i = 0; i < tensors.size(); ++i) {
      StoredTensor* t = tensors[i];
      out[i].setName(t->spec().name);
      auto data = out[i].initValues(static_cast<unsigned>(t->size() * sizeof(float)));
      std::span<float> dst(reinterpret_cast<float*>(data.begin()), t->size());
      bytes += data.size();
      auto version = out[i];
      if (data.size() <= options_.inline_bytes) {
        version.setVersion(t->read(dst));
      } else {
        auto v = std::make_shared<uint64_t>(0);
        copies.add(pool_.run(t->id(), [t, dst, v] { *v = t->read(dst); }).then([version, v]() mutable {
          version.setVersion(*v);
        }));
      }
    }
    counters_.pulls += tensors.size();
    counters_.bytes_out += bytes;
    return kj::joinPromises(copies.releaseAsArray());
  });
}

kj::Promise<void> Shard::push(wire::Shard::PushParams::Reader params, wire::Shard::PushResults::Builder results) {
  auto grads = params.getGrads();
  std::vector<std::pair<StoredTensor*, std::span<const float>>> work;
  work.reserve(grads.size());
  std::set<StoredTensor*> seen;
  uint64_t bytes = 0;
  for (auto g : grads) {
    StoredTensor& t = store_.get(g.getName());
    auto data = g.getValues();
    if (data.size() != t.size() * sizeof(float)) {
      throw RequestError("push: tensor '" + t.spec().name + "' of shape " + shape_to_string(t.spec().shape) +
                         " expects " + std::to_string(t.size()) + " floats (" + std::to_string(t.size() * 4) +
                         " bytes), got " + std::to_string(data.size()) + " bytes");
    }
    if (!seen.insert(&t).second) throw RequestError("push: tensor '" + t.spec().name + "' appears twice in one request");
    auto values = as_floats(data);
    if (!options_.allow_nonfinite && !all_finite(values)) {
      throw RequestError("push: gradient for '" + t.spec().name + "' contains NaN or Inf (refused; psd --allow_nonfinite accepts it)");
    }
    work.emplace_back(&t, values);
    bytes += data.size();
  }

  auto status = results.initStatus(static_cast<unsigned>(work.size()));
  kj::Vector<kj::Promise<void>> applies;
  for (unsigned i = 0; i < work.size(); ++i) {
    auto [t, g] = work[i];
    status.set(i, wire::PushStatus::APPLIED);
    if (g.size_bytes() <= options_.inline_bytes) {
      t->apply(g, 1.0f);
    } else {
      applies.add(pool_.run(t->id(), [t, g] { t->apply(g, 1.0f); }));
    }
  }
  counters_.pushes += work.size();
  counters_.bytes_in += bytes;
  results.setStep(global_step_);
  return kj::joinPromises(applies.releaseAsArray());
}

void Shard::list(wire::Shard::ListResults::Builder results) const {
  auto all = store_.all();
  auto out = results.initTensors(static_cast<unsigned>(all.size()));
  for (unsigned i = 0; i < all.size(); ++i) to_wire_meta(*all[i], false, out[i]);
}

void Shard::stats(wire::ShardStats::Builder out) const {
  out.setTensors(store_.count());
  out.setBytes(store_.bytes());
  out.setPushes(counters_.pushes);
  out.setPulls(counters_.pulls);
  out.setRejected(counters_.rejected);
  out.setStaleGradients(counters_.stale);
  out.setGlobalStep(global_step_);
  out.setConnections(counters_.connections);
}

void Shard::info(wire::ShardInfo::Builder out) const {
  out.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  out.setShardIndex(options_.shard_index);
  out.setNumShards(options_.num_shards);
  out.setServerVersion("psd " PS_VERSION);
  out.setGlobalStep(global_step_);
  out.setMaxMessageBytes(options_.max_message_bytes);
}

}  // namespace ps
