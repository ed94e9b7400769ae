#include "common/embedding_wire.h"

#include <capnp/any.h>

#include "common/tensor_name.h"
#include "common/wire_convert.h"
#include "ps/errors.h"

namespace ps {

void to_wire(const TableSpec& s, uint32_t shard_index, uint32_t num_shards,
             wire::TableSpec::Builder out) {
  out.setName(capnp::Text::Reader(s.name.c_str(), s.name.size()));  // every byte, NULs too
  out.setDim(s.dim);
  out.setRows(s.rows);
  out.setDynamic(s.dynamic);
  // A dynamic table's ids are always placed by hash, whatever the field says.
  out.setPlacement(
      static_cast<wire::TablePlacement>(s.dynamic ? TablePlacement::kHash : s.placement));
  out.setRowLimit(s.row_limit);
  out.setOnLimit(static_cast<wire::RowLimitPolicy>(s.on_limit));
  auto o = out.initOptimizer();
  o.setKind(static_cast<wire::RowOptimizerKind>(s.optimizer.kind));
  o.setLearningRate(s.optimizer.learning_rate);
  o.setInitialAccumulator(s.optimizer.initial_accumulator);
  o.setBeta1(s.optimizer.beta1);
  o.setBeta2(s.optimizer.beta2);
  o.setEpsilon(s.optimizer.epsilon);
  o.setL1(s.optimizer.l1);
  o.setL2(s.optimizer.l2);
  o.setLrPower(s.optimizer.lr_power);
  to_wire(s.init, out.initInit());
  out.setShardIndex(shard_index);
  out.setNumShards(num_shards);
  out.setMinCount(s.min_count);
  out.setCountSketchWidth(s.count_sketch_width);
  out.setExpireAfterSteps(s.expire_after_steps);
}

ShardTableSpec from_wire(wire::TableSpec::Reader in) {
  ShardTableSpec r;
  TableSpec& s = r.spec;
  s.name = name_from_wire(in.getName(), "createTables: table");  // every byte sent
  s.dim = in.getDim();
  s.rows = in.getRows();
  s.dynamic = in.getDynamic();
  const auto placement = static_cast<unsigned>(in.getPlacement());
  const auto on_limit = static_cast<unsigned>(in.getOnLimit());
  auto o = in.getOptimizer();
  const auto kind = static_cast<unsigned>(o.getKind());
  if (placement > 2 || on_limit > 1 || kind > 3) {
    throw RequestError("createTables: table '" + s.name +
                       "' has a placement, limit policy or optimizer this psd "
                       "does not know");
  }
  s.placement = static_cast<TablePlacement>(placement);
  s.row_limit = in.getRowLimit();
  s.on_limit = static_cast<OnRowLimit>(on_limit);
  s.optimizer.kind = static_cast<RowOptimizerKind>(kind);
  s.optimizer.learning_rate = o.getLearningRate();
  s.optimizer.initial_accumulator = o.getInitialAccumulator();
  s.optimizer.beta1 = o.getBeta1();
  s.optimizer.beta2 = o.getBeta2();
  s.optimizer.epsilon = o.getEpsilon();
  s.optimizer.l1 = o.getL1();
  s.optimizer.l2 = o.getL2();
  s.optimizer.lr_power = o.getLrPower();
  s.init = from_wire(in.getInit());
  s.min_count = in.getMinCount();
  s.count_sketch_width = in.getCountSketchWidth();
  s.expire_after_steps = in.getExpireAfterSteps();
  r.shard_index = in.getShardIndex();
  r.num_shards = in.getNumShards();
  return r;
}

std::span<const uint64_t> ids_in_place(capnp::List<uint64_t>::Reader ids, const char* what) {
  if (ids.size() == 0) return {};
  capnp::AnyList::Reader any(ids);
  if (any.getElementSize() != capnp::ElementSize::EIGHT_BYTES) {
    throw RequestError(std::string(what) + ": ids must be a packed list of UInt64");
  }
  auto bytes = any.getRawBytes();
  if (bytes.size() != std::size_t(ids.size()) * sizeof(uint64_t)) {
    throw RequestError(std::string(what) + ": malformed id list");
  }
  return {reinterpret_cast<const uint64_t*>(bytes.begin()), ids.size()};
}

std::vector<uint32_t> ages_from_wire(capnp::List<uint32_t>::Reader ages) {
  std::vector<uint32_t> out;
  out.reserve(ages.size());
  for (uint32_t a : ages) out.push_back(a);
  return out;
}

}  // namespace ps
