# psd's checkpoint files: the metadata records (Cap'n Proto); tensor values
# and optimizer slots follow as raw little-endian float32 records. The framing
# (magic, format version, per-record CRC-32C) is in checkpoint/checkpoint_file.h.
# Not a wire contract: only psd and libpsclient's restore read these files,
# and a change here bumps kFormatVersion.

@0xb7e3c9a1d2f40586;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ps::ckpt");

using Ps = import "ps.capnp";

const kFormatVersion :UInt32 = 2;
# Version 2 added TableHeader.ages and the count sketch; version 1 files are
# read as having neither.

# A worker's recently applied push request ids (oldest first), so a push
# retried across a psd restart is still recognised.
struct RecentRequest {
  id @0 :UInt64;
  step @1 :Int64;              # the step answered
  statuses @2 :Data;           # the PushStatus per gradient, one byte each
}

struct WorkerRequests {
  workerIndex @0 :Int32;
  recent @1 :List(RecentRequest);
  clientId @2 :UInt64;         # a client without a worker index (workerIndex -1): its hello's clientId
}

struct Header {
  shardIndex @0 :UInt32;
  numShards @1 :UInt32;
  globalStep @2 :Int64;
  jobConfigured @3 :Bool;
  job @4 :Ps.JobConfig;
  ready @5 :Bool;
  unixSecs @6 :Float64;
  tensorCount @7 :UInt64;
  requests @8 :List(WorkerRequests);
  serverVersion @9 :Text;
  tableCount @10 :UInt64;      # embedding tables, after the tensors (0 in files without tables)
}

# Followed by 1 + numSlots raw records of `elements` floats: values, then slots.
struct TensorHeader {
  spec @0 :Ps.TensorSpec;      # name, shape, optimizer, trainable, part, version (init unused)
  numSlots @1 :UInt32;
  elements @2 :UInt64;
}

# An embedding table's rows on this shard (a dynamic table: only the rows
# that exist). Followed by 2 + numSlots raw records: the rows' ids (uint64),
# their values, then each slot (rows * dim float32 each, in the ids' order),
# then, where `ages` is set, one uint32 per row: the steps since its last touch,
# then, where sketchWidth is not 0, the count sketch's 4 * sketchWidth
# one-byte counters (server/embedding/count_sketch.h).
struct TableHeader {
  spec @0 :Ps.TableSpec;       # with the shard index and count it was placed for
  numSlots @1 :UInt32;
  rows @2 :UInt64;
  version @3 :UInt64;
  evictions @4 :UInt64;
  ages @5 :Bool;               # a table whose rows expire (TableSpec.expireAfterSteps)
  sketchKey @6 :UInt64;        # a table admitting ids by count (TableSpec.minCount): its
  sketchWidth @7 :UInt32;      # sketch's hash key and width, so a restarted psd counts on
}

struct Footer {
  tensorCount @0 :UInt64;      # must match the header: a file cut between records is caught here
  tableCount @1 :UInt64;
}
