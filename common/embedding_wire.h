// Embedding tables' Cap'n Proto form (schema/ps.capnp): table specs both
// ways, and the packed id lists read in place.
#pragma once

#include <cstdint>
#include <span>

#include "ps/embedding.h"
#include "schema/ps.capnp.h"

namespace ps {

// A table spec as one shard gets it: the spec and where the client placed
// the shard (shard `shard_index` of `num_shards`).
struct ShardTableSpec {
  TableSpec spec;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
};

void to_wire(const TableSpec& s, uint32_t shard_index, uint32_t num_shards,
             wire::TableSpec::Builder out);
// Throws RequestError for an enum value this build does not know.
ShardTableSpec from_wire(wire::TableSpec::Reader in);

// The ids of a List(UInt64) as they lie in the received message (no copy).
// Throws RequestError for a list of another layout (`what` names the request).
std::span<const uint64_t> ids_in_place(capnp::List<uint64_t>::Reader ids, const char* what);
// restoreRows' ages, copied out of the message.
std::vector<uint32_t> ages_from_wire(capnp::List<uint32_t>::Reader ages);

}  // namespace ps
