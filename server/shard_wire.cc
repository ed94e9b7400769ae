#include "server/shard_wire.h"

#include "common/tensor_name.h"

#include <optional>

#include <capnp/orphan.h>

#include "common/net/host_id.h"
#include "common/wire_convert.h"
#include "server/shard.h"

namespace ps {
namespace {

// GradientStatus is stored in the request log and checkpoints by the wire's numbering.
constexpr bool same_number(wire::PushStatus w, GradientStatus g) {
  return static_cast<unsigned>(w) == static_cast<unsigned>(g);
}
static_assert(same_number(wire::PushStatus::APPLIED, GradientStatus::kApplied) &&
              same_number(wire::PushStatus::ACCUMULATED, GradientStatus::kAccumulated) &&
              same_number(wire::PushStatus::STALE, GradientStatus::kStale) &&
              same_number(wire::PushStatus::DUPLICATE, GradientStatus::kDuplicate));

std::string_view text_view(capnp::Text::Reader t) { return {t.cStr(), t.size()}; }

// A tensor name as sent, every byte of it (not up to a NUL), after
// check_name: the view points into the message.
std::string_view name_view(capnp::Text::Reader t, const char* what) {
  const std::string_view name = text_view(t);
  check_name(name, what);
  return name;
}

std::optional<PartMeta> part_from_wire(wire::TensorSpec::Reader spec) {
  if (!spec.hasPart()) return std::nullopt;
  auto p = spec.getPart();
  return PartMeta{std::string(text_view(p.getFullName())),  // every byte: the store checks them
                  shape_from_wire(p.getFullShape()), p.getOffset(), p.getIndex(), p.getCount()};
}

SharedSliceRef slice_from_wire(wire::SharedSlice::Reader s) {
  return {s.getRegion(), s.getOffset(), s.getBytes()};
}

// Tensors from this size up are sent from their own memory (a copy-on-write
// snapshot held by the connection until written) rather than copied into the
// reply: no memset and memcpy on the event loop before the send. Each is a
// message segment of its own; readers refuse messages of 512 segments or
// more, hence the cap per reply.
constexpr uint64_t kSendInPlaceBytes = wire::K_PULL_SEGMENT_BYTES;
constexpr unsigned kMaxInPlacePerReply = 64;

}  // namespace

CreateRequest create_from_wire(wire::Shard::CreateParams::Reader params) {
  CreateRequest request;
  auto specs = params.getSpecs();
  request.tensors.reserve(specs.size());
  for (auto s : specs) request.tensors.push_back({from_wire(s), part_from_wire(s)});
  request.validate_only = params.getValidateOnly();
  request.values_left_out = params.getValuesLeftOut();
  request.pending_tensors = params.getPendingTensors();
  request.pending_bytes = params.getPendingBytes();
  return request;
}

void to_wire_meta(const StoredTensor& t, bool created, wire::TensorMeta::Builder out) {
  out.setName(t.spec().name);
  auto shape = out.initShape(static_cast<unsigned>(t.spec().shape.size()));
  for (unsigned i = 0; i < t.spec().shape.size(); ++i) shape.set(i, t.spec().shape[i]);
  out.setVersion(t.version());
  out.setOptimizer(static_cast<wire::OptimizerKind>(t.spec().optimizer.kind));
  out.setTrainable(t.spec().trainable);
  out.setCreated(created);
  if (const auto& p = t.part()) part_to_wire(*p, out.initPart());
}

void create_to_wire(const CreateRequest& request, const CreateReply& reply,
                    wire::Shard::CreateResults::Builder results) {
  auto out = results.initTensors(static_cast<unsigned>(reply.tensors.size()));
  for (unsigned i = 0; i < out.size(); ++i)
    to_wire_meta(*reply.tensors[i].tensor, reply.tensors[i].created, out[i]);
  if (request.validate_only) {
    results.setPendingTensors(reply.pending_tensors);
    results.setPendingBytes(reply.pending_bytes);
  }
}

PushRequest push_from_wire(wire::Shard::PushParams::Reader params) {
  PushRequest request;
  request.step = params.getStep();
  request.request_id = params.getRequestId();
  request.done_step = params.getDoneStep();
  auto grads = params.getGrads();
  request.grads.reserve(grads.size());
  for (auto g : grads) {
    auto data = g.getValues();
    PushGradient& out = request.grads.emplace_back();
    out.name = name_view(g.getName(), "push: tensor");
    out.values = as_floats(data);
    out.bytes = data.size();
    if (g.hasShared()) out.shared = slice_from_wire(g.getShared());
  }
  return request;
}

void push_to_wire(const PushReply& reply, wire::Shard::PushResults::Builder results) {
  results.setStep(reply.step);
  results.setStop(reply.stop);
  auto status = results.initStatus(static_cast<unsigned>(reply.status.size()));
  for (unsigned i = 0; i < status.size(); ++i)
    status.set(i, static_cast<wire::PushStatus>(reply.status[i]));
}

PullRequest pull_from_wire(wire::Shard::PullParams::Reader params) {
  PullRequest request;
  auto names = params.getNames();
  request.names.reserve(names.size());
  for (auto n : names) request.names.push_back(name_view(n, "pull: tensor"));
  request.min_step = params.getMinStep();
  if (params.hasInto()) {
    auto into = params.getInto();
    request.into.reserve(into.size());
    for (auto s : into) request.into.push_back(slice_from_wire(s));
  }
  return request;
}

void stats_to_wire(const Shard& shard, wire::ShardStats::Builder out) {
  const TensorStore& store = shard.store();
  const ShardCounters& counters = shard.counters();
  const JobState& job = shard.job();
  out.setTensors(store.count());
  out.setBytes(store.bytes());
  out.setPushes(counters.pushes);
  out.setPulls(counters.pulls);
  out.setRejected(counters.rejected);
  out.setStaleGradients(counters.stale);
  out.setGlobalStep(job.global_step());
  out.setConnections(counters.connections);
  job_to_wire(job.config(), out.initJob());
  out.setReady(job.ready());
  out.setStalenessWaits(job.staleness_waits());
  out.setMaxStaleness(job.max_staleness_seen());
  out.setStepsApplied(counters.steps_applied);
  out.setFinished(job.finished());
  out.setAwaitingChief(job.awaiting_chief());
  out.setBytesIn(counters.bytes_in);
  out.setBytesOut(counters.bytes_out);
  out.setSharedBytes(counters.shared_bytes);
  out.setLastCheckpointStep(counters.last_checkpoint_step);
  out.setLastCheckpointUnixSecs(counters.last_checkpoint_unix_secs);
  auto waits = out.initWaits(static_cast<unsigned>(shard.current_waits().size()));
  for (unsigned w = 0; w < waits.size(); ++w) waits.set(w, shard.current_waits()[w]);
  const std::vector<TableReport> tables = shard.list_tables();
  auto table_stats = out.initTables(static_cast<unsigned>(tables.size()));
  for (unsigned i = 0; i < tables.size(); ++i) {
    table_stats[i].setName(tables[i].spec.name);
    table_stats[i].setRows(tables[i].rows_here);
    table_stats[i].setBytes(tables[i].bytes);
    table_stats[i].setRowsPulled(tables[i].rows_pulled);
    table_stats[i].setRowsPushed(tables[i].rows_pushed);
    table_stats[i].setEvictions(tables[i].evictions);
    table_stats[i].setIdsFiltered(tables[i].ids_filtered);
    table_stats[i].setRowsExpired(tables[i].rows_expired);
  }
  auto workers = out.initWorkers(static_cast<unsigned>(job.workers().size()));
  unsigned i = 0;
  for (const auto& [index, w] : job.workers()) {
    workers[i].setWorkerIndex(index);
    workers[i].setStep(w.step);
    workers[i].setConnected(w.connections > 0);
    workers[i].setPushes(w.pushes);
    workers[i].setStale(w.stale);
    workers[i].setPeer(w.peer);
    if (w.report) {
      workers[i].setLoss(w.report->loss);
      workers[i].setSamplesPerSec(w.report->samples_per_sec);
    }
    ++i;
  }
}

void info_to_wire(const Shard& shard, wire::ShardInfo::Builder out) {
  const ShardOptions& options = shard.options();
  const JobState& job = shard.job();
  out.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  out.setShardIndex(options.shard_index);
  out.setNumShards(options.num_shards);
  out.setServerVersion("psd " PS_VERSION);
  out.setGlobalStep(job.global_step());
  out.setMaxMessageBytes(options.max_message_bytes);
  out.setUnixSocket(options.unix_socket);
  out.setHostId(host_id());
  out.setInstanceId(shard.instance_id());
  out.setTensors(shard.store().count());
  out.setTables(shard.table_count());
  out.setSharedMemory(!options.unix_socket.empty() && options.max_shared_memory_bytes > 0);
  out.setAllowsNonfinite(options.allow_nonfinite);
  job_to_wire(job.config(), out.initJob());
}

namespace {

// A reply tensor of this size that may go in place (the cap aside).
bool fits_in_place(uint64_t bytes) {
  return bytes >= kSendInPlaceBytes && bytes % sizeof(capnp::word) == 0;
}

}  // namespace

void WirePullReply::start(std::span<const Tensor> tensors) {
  uint64_t words = 16;
  unsigned in_place = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    words += 8 + (t.name.size() + 8) / sizeof(capnp::word);
    if (t.in_shared) continue;
    if (!fits_in_place(t.bytes)) {
      words += (t.bytes + 7) / sizeof(capnp::word);
    } else if (in_place++ == kMaxInPlacePerReply) {
      in_place_before_ = i;  // the first tensor past the cap, and every later one, is copied
    }
  }
  if (connection_ == nullptr) in_place_before_ = 0;
  results_ = results(capnp::MessageSize{words, 0});
  results_.setTag(tag_);
  entries_ = results_.initTensors(static_cast<unsigned>(tensors.size()));
  for (unsigned i = 0; i < tensors.size(); ++i) {
    entries_[i].setName(capnp::Text::Reader(tensors[i].name.data(), tensors[i].name.size()));
  }
}

void WirePullReply::value(std::size_t i, uint64_t version,
                          std::shared_ptr<const std::vector<float>> values) {
  auto entry = entries_[static_cast<unsigned>(i)];
  entry.setVersion(version);
  auto data = kj::arrayPtr(reinterpret_cast<const kj::byte*>(values->data()),
                           values->size() * sizeof(float));
  if (i < in_place_before_ && fits_in_place(data.size())) {
    entry.adoptValues(
        capnp::Orphanage::getForMessageContaining(results_).referenceExternalData(data));
    held_.push_back(std::move(values));
  } else {
    entry.setValues(data);
  }
}

void WirePullReply::done() {
  for (auto& values : held_) {
    const float* data = values->data();  // before the move: argument order is unspecified
    connection_->hold_until_sent(data, std::move(values));
  }
  held_.clear();
}

}  // namespace ps
