#include "common/wire_convert.h"

#include <cstring>

#include "ps/errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian float32");

namespace ps {

void to_wire(const OptimizerConfig& c, wire::OptimizerSpec::Builder out) {
  out.setKind(static_cast<wire::OptimizerKind>(c.kind));
  out.setLearningRate(c.learning_rate);
  out.setMomentum(c.momentum);
  out.setNesterov(c.nesterov);
  out.setBeta1(c.beta1);
  out.setBeta2(c.beta2);
  out.setEpsilon(c.epsilon);
  out.setInitialAccumulator(c.initial_accumulator);
  out.setDecay(c.decay);
  out.setSchedule(static_cast<wire::LrSchedule>(c.schedule));
  out.setDecayRate(c.decay_rate);
  out.setDecaySteps(c.decay_steps);
  out.setStaircase(c.staircase);
  auto b = out.initBoundaries(static_cast<unsigned>(c.boundaries.size()));
  for (unsigned i = 0; i < c.boundaries.size(); ++i) b.set(i, c.boundaries[i]);
  out.setAlpha(c.alpha);
}

OptimizerConfig from_wire(wire::OptimizerSpec::Reader in) {
  OptimizerConfig c;
  auto kind = static_cast<unsigned>(in.getKind());
  if (kind > static_cast<unsigned>(OptimizerKind::kRmsProp))
    throw RequestError("unknown optimizer kind " + std::to_string(kind));
  c.kind = static_cast<OptimizerKind>(kind);
  c.learning_rate = in.getLearningRate();
  c.momentum = in.getMomentum();
  c.nesterov = in.getNesterov();
  c.beta1 = in.getBeta1();
  c.beta2 = in.getBeta2();
  c.epsilon = in.getEpsilon();
  c.initial_accumulator = in.getInitialAccumulator();
  c.decay = in.getDecay();
  auto schedule = static_cast<unsigned>(in.getSchedule());
  if (schedule > static_cast<unsigned>(LrSchedule::kCosineDecay))
    throw RequestError("unknown learning-rate schedule " + std::to_string(schedule));
  c.schedule = static_cast<LrSchedule>(schedule);
  c.decay_rate = in.getDecayRate();
  c.decay_steps = in.getDecaySteps();
  c.staircase = in.getStaircase();
  if (in.getBoundaries().size() > kMaxBoundaries) {  // refused before it is copied
    throw RequestError("a piecewise schedule has at most " + std::to_string(kMaxBoundaries) +
                       " boundaries, not " + std::to_string(in.getBoundaries().size()));
  }
  for (int64_t b : in.getBoundaries()) c.boundaries.push_back(b);
  c.alpha = in.getAlpha();
  return c;
}

void to_wire(const InitConfig& c, wire::Initializer::Builder out) {
  out.setKind(static_cast<wire::InitKind>(c.kind));
  out.setA(c.a);
  out.setB(c.b);
  out.setSeed(c.seed);
  if (c.kind == InitKind::kValues) {
    out.setValues(as_data(std::span<const float>(c.values)));
  }
}

InitConfig from_wire(wire::Initializer::Reader in) {
  InitConfig c;
  auto kind = static_cast<unsigned>(in.getKind());
  if (kind > static_cast<unsigned>(InitKind::kValues))
    throw RequestError("unknown initializer kind " + std::to_string(kind));
  c.kind = static_cast<InitKind>(kind);
  c.a = in.getA();
  c.b = in.getB();
  c.seed = in.getSeed();
  if (c.kind == InitKind::kValues) {
    auto data = in.getValues();
    if (data.size() % sizeof(float) != 0)
      throw RequestError("initial values are not a whole number of float32s");
    auto f = as_floats(data);
    c.values.assign(f.begin(), f.end());
  }
  return c;
}

std::vector<uint64_t> shape_from_wire(capnp::List<uint64_t>::Reader in) {
  std::vector<uint64_t> shape;
  shape.reserve(in.size());
  for (uint64_t d : in) shape.push_back(d);
  return shape;
}

void to_wire(const TensorSpec& s, wire::TensorSpec::Builder out) {
  out.setName(s.name);
  auto shape = out.initShape(static_cast<unsigned>(s.shape.size()));
  for (unsigned i = 0; i < s.shape.size(); ++i) shape.set(i, s.shape[i]);
  to_wire(s.optimizer, out.initOptimizer());
  to_wire(s.init, out.initInit());
  out.setTrainable(s.trainable);
  if (!s.slots.empty()) {
    auto slots = out.initSlots(static_cast<unsigned>(s.slots.size()));
    for (unsigned i = 0; i < s.slots.size(); ++i) slots.set(i, as_data(s.slots[i]));
  }
  out.setVersion(s.version);
}

TensorSpec from_wire(wire::TensorSpec::Reader in) {
  TensorSpec s;
  s.name =
      std::string(in.getName().begin(), in.getName().size());  // every byte: checked by the store
  s.shape = shape_from_wire(in.getShape());
  s.optimizer = from_wire(in.getOptimizer());
  s.init = from_wire(in.getInit());
  s.trainable = in.getTrainable();
  for (auto slot : in.getSlots()) {
    if (slot.size() % sizeof(float) != 0)
      throw RequestError("tensor '" + s.name + "': an optimizer slot is not whole floats");
    auto f = as_floats(slot);
    s.slots.emplace_back(f.begin(), f.end());
  }
  s.version = in.getVersion();
  return s;
}

JobConfig job_from_wire(wire::JobConfig::Reader in) {
  JobConfig c;
  auto mode = static_cast<unsigned>(in.getMode());
  if (mode > static_cast<unsigned>(SyncMode::kBoundedStaleness))
    throw RequestError("unknown job mode " + std::to_string(mode));
  c.mode = static_cast<SyncMode>(mode);
  c.replicas_to_aggregate = in.getReplicasToAggregate();
  c.total_replicas = in.getTotalReplicas();
  c.max_staleness = in.getMaxStaleness();
  c.train_steps = in.getTrainSteps();
  c.start_step = in.getStartStep();
  for (auto h : in.getWorkerHosts()) c.worker_hosts.emplace_back(h.cStr(), h.size());
  for (auto h : in.getPsHosts()) c.ps_hosts.emplace_back(h.cStr(), h.size());
  if (!step_in_range(c.start_step)) {
    throw RequestError("job start step " + std::to_string(c.start_step) +
                       " is out of range [0, 2^62]");
  }
  return c;
}

void job_to_wire(const JobConfig& c, wire::JobConfig::Builder out) {
  out.setMode(static_cast<wire::SyncMode>(c.mode));
  out.setReplicasToAggregate(c.replicas_to_aggregate);
  out.setTotalReplicas(c.total_replicas);
  out.setMaxStaleness(c.max_staleness);
  out.setTrainSteps(c.train_steps);
  out.setStartStep(c.start_step);
  if (!c.worker_hosts.empty()) {
    auto w = out.initWorkerHosts(static_cast<unsigned>(c.worker_hosts.size()));
    for (unsigned i = 0; i < c.worker_hosts.size(); ++i) w.set(i, c.worker_hosts[i]);
  }
  if (!c.ps_hosts.empty()) {
    auto p = out.initPsHosts(static_cast<unsigned>(c.ps_hosts.size()));
    for (unsigned i = 0; i < c.ps_hosts.size(); ++i) p.set(i, c.ps_hosts[i]);
  }
}

void part_to_wire(const PartMeta& p, wire::PartInfo::Builder out) {
  out.setFullName(p.full_name);
  auto fs = out.initFullShape(static_cast<unsigned>(p.full_shape.size()));
  for (unsigned i = 0; i < p.full_shape.size(); ++i) fs.set(i, p.full_shape[i]);
  out.setOffset(p.offset);
  out.setIndex(p.index);
  out.setCount(p.count);
}

}  // namespace ps
