# The wire contract between libpsclient and psd.
#
# Versioning: `kProtocolVersion` changes whenever a change here is not
# compatible both ways. A client says its version in `hello`; a shard with a
# different major version refuses it with a message naming both versions.
# Fields are only ever added (new ordinals), never renumbered.
#
# Errors: a request that cannot be honoured fails as a whole with a Cap'n
# Proto exception whose description is a one-line message for a person
# ("push: tensor 'w' expects 4 floats, got 3"). Nothing of a failed request is
# applied. Outcomes that are part of normal training (a stale gradient in sync
# mode) are not errors: they come back as a status in the result.

@0xd1c2a3b4e5f60718;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ps::wire");

const kProtocolVersion :UInt32 = 1;

const kPullSegmentBytes :UInt32 = 65536;
# In a pull reply, psd sends each tensor of at least this many bytes (a
# whole number of words) as a message segment of its own; smaller ones are
# in the first segment with the rest of the reply (Shard.pull).

enum OptimizerKind {
  sgd @0;
  momentum @1;
  adam @2;
  adagrad @3;
  rmsprop @4;
}

struct OptimizerSpec {
  kind @0 :OptimizerKind = sgd;
  learningRate @1 :Float32 = 0.01;
  momentum @2 :Float32 = 0.9;      # momentum; also RMSProp's momentum
  nesterov @3 :Bool = false;
  beta1 @4 :Float32 = 0.9;         # Adam
  beta2 @5 :Float32 = 0.999;       # Adam
  epsilon @6 :Float32 = 1e-7;      # Adam, Adagrad, RMSProp (TF's defaults differ per optimizer; clients fill it)
  initialAccumulator @7 :Float32 = 0.1;  # Adagrad
  decay @8 :Float32 = 0.9;         # RMSProp
  schedule @9 :LrSchedule = constant;
  decayRate @10 :Float32 = 1.0;
  decaySteps @11 :Int64 = 1;
  staircase @12 :Bool = false;
  boundaries @13 :List(Int64);
  alpha @14 :Float32 = 0.0;        # cosineDecay: the final rate as a fraction of learningRate
}

enum LrSchedule {
  constant @0;
  exponentialDecay @1;
  piecewise @2;
  cosineDecay @3;     # as tf.compat.v1.train.cosine_decay(lr, step, decaySteps, alpha)
}

enum InitKind {
  zeros @0;
  constant @1;
  uniform @2;         # U(a, b)
  normal @3;          # N(mean=a, stddev=b)
  truncatedNormal @4; # N(a, b) redrawn beyond 2 stddev, as TF
  glorotUniform @5;   # U(-l, l), l = sqrt(6 / (fanIn + fanOut))
  glorotNormal @6;
  values @7;          # the `values` field holds the initial contents
}

struct Initializer {
  kind @0 :InitKind = zeros;
  a @1 :Float32;
  b @2 :Float32;
  seed @3 :UInt64;
  fanIn @4 :UInt32;
  fanOut @5 :UInt32;
  values @6 :Data;    # little-endian float32, for kind = values
}

# A tensor that is one part of a larger logical tensor split over shards.
struct PartInfo {
  fullName @0 :Text;
  fullShape @1 :List(UInt64);
  offset @2 :UInt64;     # first element of the part in the flattened tensor
  index @3 :UInt32;
  count @4 :UInt32;      # number of parts
}

struct TensorSpec {
  name @0 :Text;
  shape @1 :List(UInt64);
  optimizer @2 :OptimizerSpec;
  init @3 :Initializer;
  trainable @4 :Bool = true;   # counted by sync mode's step barrier
  part @5 :PartInfo;           # set when this tensor is a chunk of another
  slots @6 :List(Data);        # restore: optimizer slots (float32 each), in the optimizer's order
  version @7 :UInt64;          # restore: updates already applied
}

struct TensorMeta {
  name @0 :Text;
  shape @1 :List(UInt64);
  version @2 :UInt64;          # number of updates applied
  optimizer @3 :OptimizerKind;
  trainable @4 :Bool;
  part @5 :PartInfo;
  created @6 :Bool;            # true if this request created it, false if it existed
}

struct TensorData {
  name @0 :Text;
  version @1 :UInt64;
  values @2 :Data;             # little-endian float32, shape's product elements
}

struct Gradient {
  name @0 :Text;
  values @1 :Data;             # little-endian float32, same count as the tensor
  shared @2 :SharedSlice;      # set: the values are here instead (then `values` is empty)
}

# Bytes in the connection's shared memory region (Shard.attachMemory): a
# same-host client's way to move tensor values without the socket.
struct SharedSlice {
  region @0 :UInt32;           # as attachMemory returned it
  offset @1 :UInt64;
  bytes @2 :UInt64;
}

enum PushStatus {
  applied @0;       # async: applied now
  accumulated @1;   # sync: counted towards the step; applied when enough arrive
  stale @2;         # sync: for a step that is already done; dropped
  duplicate @3;     # this worker already contributed to this step; dropped
}

enum SyncMode {
  async @0;
  sync @1;
  boundedStaleness @2;
}

struct JobConfig {
  mode @0 :SyncMode = async;
  replicasToAggregate @1 :UInt32;   # sync: gradients averaged per step
  totalReplicas @2 :UInt32;         # workers in the job (>= replicasToAggregate)
  maxStaleness @3 :UInt32;          # boundedStaleness
  trainSteps @4 :Int64;             # stop condition; 0 = none
  startStep @5 :Int64;              # the global step a new job starts at (restored from a checkpoint)
  workerHosts @6 :List(Text);       # the chief's cluster as it was started (informational: each worker
  psHosts @7 :List(Text);           # checks its own against it at waitReady); empty: not given
}

struct ShardInfo {
  protocolVersion @0 :UInt32;
  shardIndex @1 :UInt32;
  numShards @2 :UInt32;
  serverVersion @3 :Text;
  globalStep @4 :Int64;
  job @5 :JobConfig;
  maxMessageBytes @6 :UInt64;
  unixSocket @7 :Text;         # absolute path of psd's Unix-domain socket; empty: none
  hostId @8 :Text;             # psd's host (kernel boot id): a client with the same may use unixSocket
  sharedMemory @9 :Bool;       # attachMemory is accepted on unixSocket's connections
  allowsNonfinite @10 :Bool;   # psd --allow_nonfinite: gradients with NaN/Inf are applied, not refused
  workerStep @11 :Int64 = -1;  # hello: the step psd recorded for the worker saying it (-1: none), where
                               # a restarted worker goes on (bounded staleness counts steps per worker)
  instanceId @12 :UInt64;      # drawn at random when psd starts (0: an older psd). A client that
                               # reconnects to another instance knows psd restarted: what it sent
                               # since psd's last checkpoint may be lost, even at the same global step
  tensors @13 :UInt64;         # tensors the shard holds: a restarted psd with none lost the model (no checkpoint)
  tables @14 :UInt64;          # embedding tables it holds (0 from an older psd): the model too
}

struct WorkerState {
  workerIndex @0 :Int32;
  step @1 :Int64;          # last step the worker reported (pushed at or finished)
  connected @2 :Bool;
  pushes @3 :UInt64;
  stale @4 :UInt64;        # its gradients dropped as stale
  loss @5 :Float32;        # from its last report
  samplesPerSec @6 :Float32;
  peer @7 :Text;
}

struct ShardStats {
  tensors @0 :UInt64;
  bytes @1 :UInt64;
  pushes @2 :UInt64;
  pulls @3 :UInt64;
  rejected @4 :UInt64;          # requests refused as bad input
  staleGradients @5 :UInt64;    # sync: dropped as stale (including backup workers' late ones)
  globalStep @6 :Int64;
  connections @7 :UInt32;
  job @8 :JobConfig;
  ready @9 :Bool;
  workers @10 :List(WorkerState);
  stalenessWaits @11 :UInt64;   # bounded staleness: pulls that had to wait
  maxStaleness @12 :Int64;      # bounded staleness: largest (worker step - slowest live step) seen at a push
  stepsApplied @13 :UInt64;     # sync: aggregated updates applied
  finished @14 :Bool;
  bytesIn @15 :UInt64;
  bytesOut @16 :UInt64;
  lastCheckpointStep @17 :Int64;   # -1: none yet
  lastCheckpointUnixSecs @18 :Float64;
  sharedBytes @19 :UInt64;      # tensor bytes pushed and pulled through shared memory (also in bytesIn/bytesOut)
  tables @20 :List(TableStats); # embedding tables held here
  waits @21 :List(Text);        # what the job has waited for over a few seconds, one line each (a sync step
                                # and the workers it misses, a barrier): for people, not parsed
  awaitingChief @22 :Bool;      # the job was restored from a checkpoint and no chief has configured it
                                # since: its stop step may yet move (a job going on)
}

# --- Embedding tables (include/ps/embedding.h) ---

enum RowOptimizerKind {
  sgd @0;
  adagrad @1;
  lazyAdam @2;
  ftrl @3;
}

struct RowOptimizerSpec {
  kind @0 :RowOptimizerKind = sgd;
  learningRate @1 :Float32 = 0.01;
  initialAccumulator @2 :Float32 = 0.1;  # Adagrad, FTRL
  beta1 @3 :Float32 = 0.9;               # LazyAdam
  beta2 @4 :Float32 = 0.999;
  epsilon @5 :Float32 = 1e-7;
  l1 @6 :Float32;                        # FTRL
  l2 @7 :Float32;
  lrPower @8 :Float32 = -0.5;
}

enum TablePlacement {
  mod @0;    # shard = id % shards (fixed tables)
  div @1;    # contiguous ranges (fixed tables)
  hash @2;   # a 64-bit mix of the id % shards (dynamic tables)
}

enum RowLimitPolicy {
  refuse @0;
  evictLru @1;
}

struct TableSpec {
  name @0 :Text;
  dim @1 :UInt32;
  rows @2 :UInt64;             # fixed tables: ids in [0, rows)
  dynamic @3 :Bool;
  placement @4 :TablePlacement;
  rowLimit @5 :UInt64;         # dynamic: most rows on one shard (0: none)
  onLimit @6 :RowLimitPolicy;
  optimizer @7 :RowOptimizerSpec;
  init @8 :Initializer;
  shardIndex @9 :UInt32;       # the client's placement: this shard's index
  numShards @10 :UInt32;       # ... among this many (common/embedding_placement.h)
  minCount @11 :UInt32;        # dynamic: a new id's row comes at its minCount-th push (ps/embedding.h)
  countSketchWidth @12 :UInt32;  # counters per row of minCount's sketch (0: the default)
  expireAfterSteps @13 :UInt64;  # dynamic: rows untouched for this many global steps are dropped (0: never)
}

struct TableMeta {
  name @0 :Text;
  dim @1 :UInt32;
  rows @2 :UInt64;             # fixed tables: all rows of the table
  dynamic @3 :Bool;
  rowsHere @4 :UInt64;         # rows this shard holds
  bytes @5 :UInt64;            # memory of this shard's rows, slots and index
  version @6 :UInt64;          # updates applied here
  created @7 :Bool;            # createTables: true if this request created it
  evictions @8 :UInt64;
  optimizer @9 :RowOptimizerKind;
  idsFiltered @10 :UInt64;     # pushed ids whose gradients were dropped, not yet admitted (minCount)
  rowsExpired @11 :UInt64;     # rows dropped by expireAfterSteps
}

struct TableStats {
  name @0 :Text;
  rows @1 :UInt64;
  bytes @2 :UInt64;
  rowsPulled @3 :UInt64;
  rowsPushed @4 :UInt64;
  evictions @5 :UInt64;
  idsFiltered @6 :UInt64;
  rowsExpired @7 :UInt64;
}

interface Shard {
  hello @0 (protocolVersion :UInt32, workerIndex :Int32, authToken :Data, isChief :Bool, probe :Bool,
            clientId :UInt64)
        -> (info :ShardInfo);
  # workerIndex is -1 for a client that is not a training worker (tools).
  # clientId: drawn at random per client (0: not given); a client without a
  # worker index has its own window of recent request ids under it, so that
  # its retried pushes are recognised however much other such clients push.
  # Refused: a worker index outside the configured job, a second live chief.
  # probe: only asks for `info` (the token is still checked); the connection
  # has not said hello after it and may say the real one next, or close (a
  # client on psd's host goes on over psd's Unix socket instead).

  create @1 (specs :List(TensorSpec), validateOnly :Bool, valuesLeftOut :Bool,
             pendingTensors :UInt64, pendingBytes :UInt64)
         -> (tensors :List(TensorMeta), pendingTensors :UInt64, pendingBytes :UInt64);
  # Idempotent: an existing tensor with the same shape is returned as is
  # (created = false); one with another shape is an error.
  # validateOnly: check everything a create would, create nothing, and
  # return no tensors. A client creating over several shards (or in several
  # requests) asks each shard first, all its specs in one request, so that
  # one refusal creates nothing anywhere and the shard's limits count
  # everything it is about to create.
  # valuesLeftOut (with validateOnly only): the specs carry no initial
  # values, and restored slots as empty lists (their number still counts);
  # the client checked their lengths and that they are finite. Keeps the
  # check of a large restore one small message.
  # pendingTensors/pendingBytes (with validateOnly only): what earlier
  # check requests of the same create found new on this shard, counted
  # against its limits with this request's; the reply gives the total for
  # the next one. A shard's share too large for one message is checked in
  # several requests, one after another, and still as a whole.

  pull @2 (names :List(Text), minStep :Int64, tag :UInt64, into :List(SharedSlice))
       -> (tensors :List(TensorData), step :Int64, tag :UInt64);
  # Values of the named tensors, all read at one global step `step`
  # (>= minStep: the call waits until the shard reaches minStep).
  # tag: echoed in the reply, where a client can read it before the
  # tensors' bytes arrive and receive them straight into their destination
  # (client/client_message_stream.h). Tensors of kPullSegmentBytes and more
  # travel as message segments of their own, after the segment holding the
  # rest of the reply.
  # into: empty, or one slice per name: a slice of nonzero size gets that
  # tensor's values written there (before the reply is sent) instead of in
  # the reply, whose `values` is then empty.

  push @3 (grads :List(Gradient), step :Int64, requestId :UInt64, doneStep :Int64 = -1)
       -> (status :List(PushStatus), step :Int64, stop :Bool);
  # step: the global step the worker's parameters were pulled at (sync mode).
  # requestId (nonzero, unique per worker): a retried push with an id the
  # shard has already applied is answered again without being applied twice.
  # doneStep >= 0 also reports that local step as done, as stepDone does,
  # saving a call per step; then step and stop are stepDone's answers.

  list @4 () -> (tensors :List(TensorMeta));
  stats @5 () -> (stats :ShardStats);

  initJob @6 (config :JobConfig) -> (info :ShardInfo);
  # Sent by the chief to every shard before it creates the tensors.
  # Idempotent for the same configuration; another one is an error.

  setReady @7 ();
  # The chief has created and initialised every tensor.

  waitReady @8 (timeoutMs :UInt32) -> (ready :Bool, step :Int64, job :JobConfig);
  # Returns once the chief called setReady, or with ready = false at the timeout.

  stepDone @9 (step :Int64, requestId :UInt64) -> (globalStep :Int64, stop :Bool);
  # A worker finished its local step `step`. Async and bounded-staleness
  # modes count the global step with these; stop = the job reached trainSteps.
  # requestId (nonzero, unique per worker, from the same numbering as push's):
  # a report sent again after a lost reply is answered with the job's step
  # and stop, not counted twice. 0: no id, every report counts.

  barrier @10 (name :Text, count :UInt32, timeoutMs :UInt32, skipLostWorkers :Bool)
      -> (arrived :UInt32);
  # Returns when `count` callers have entered barrier `name` (generation by
  # generation), or fails at the timeout. Only callers still waiting count:
  # one that timed out or went away is not there. Every caller of one
  # generation asks for the same count and skipLostWorkers; another is
  # refused. skipLostWorkers: of the job's workers 0..count-1, those this
  # psd counts as gone (connections closed; in a sync job also hung past
  # --worker_timeout_secs) and not waiting here count as arrived, so the barrier ends once every worker
  # still in the job is there (an end-of-training barrier after a worker
  # died); `arrived` says how many came. An older psd ignores it and waits.

  finish @11 ();
  # The job is over: psd exits once its workers have disconnected (when
  # started with --exit_when_done, the default).

  report @12 (step :Int64, loss :Float32, accuracy :Float32, samplesPerSec :Float32,
              learningRate :Float32) -> ();
  # A worker's training progress, for psd's metrics and status page.

  checkpoint @13 (step :Int64) -> (path :Text, step :Int64);
  # Writes a checkpoint now. With step >= 0 (sync mode) it is taken exactly
  # at that global step: the call waits for the step and holds the next one
  # until written, so all shards save the same step.

  attachMemory @14 (fd :Int32, bytes :UInt64, token :Data) -> (region :UInt32);
  # Over psd's Unix socket only (ShardInfo.sharedMemory): psd maps the
  # caller's descriptor `fd`, a memfd of `bytes` sealed against shrinking
  # (common/shared_region.h), opened through /proc with the peer's pid,
  # whose first 16 bytes must be `token` (random, written there by the
  # caller: a reused pid cannot hand psd a stranger's memory).
  # Pushes and pulls on this connection may then name slices of it. One
  # region per connection, unmapped when the connection ends.

  createTables @15 (tables :List(TableSpec), validateOnly :Bool) -> (tables :List(TableMeta));
  # Creates this shard's part of each table (all checked before any is
  # created). Idempotent: an existing table of the same kind, dim, rows and
  # optimizer is returned as is (created = false); another is an error.
  # A table whose rows would take psd past --max_memory_mb is refused.

  pullRows @16 (table :Text, ids :List(UInt64), minStep :Int64, into :SharedSlice,
                lookup :Bool)
           -> (rows :Data, step :Int64, inShared :Bool);
  # The rows of `ids` (each this shard's), in order: ids.size() * dim
  # little-endian float32. A dynamic table creates the missing ones.
  # minStep as pull's. The ids travel as one packed list.
  # into: unset or of size 0, or a slice of the connection's shared memory
  # region of exactly ids.size() * dim * 4 bytes: the rows are written there
  # (before the reply is sent) instead of in `rows`, and inShared is true.
  # lookup: create no row and move none in the LRU order; a missing row
  # reads as the table's initializer would make it (evaluation, serving).

  pushRows @17 (table :Text, ids :List(UInt64), grads :Data, step :Int64, requestId :UInt64,
                doneStep :Int64 = -1, sharedGrads :SharedSlice, idsDistinct :Bool,
                parts :UInt32 = 1)
           -> (status :PushStatus, step :Int64, stop :Bool);
  # Gradients of the rows of `ids`: ids.size() * dim float32, summed per
  # repeated id. step, requestId and doneStep as push's: in sync mode a
  # table counts towards a step like a trainable tensor (a worker sends
  # every shard its part, empty where it has no ids there).
  # sharedGrads: unset or of size 0, or the gradients in a slice of the
  # connection's shared memory region (then `grads` is empty); psd copies
  # them out before checking them.
  # parts: how many requests the sender's push sends this shard. In sync
  # mode a worker's push counts once per table and step, so it must come
  # whole: psd refuses one in parts (a client that took the job for async).
  # idsDistinct: the sender names no id twice (libpsclient sums repeats
  # before sending). psd may then skip its own search for repeats: where it
  # does, an id named twice anyway gets each gradient as its own update, in
  # order, as from separate pushes.

  listTables @18 () -> (tables :List(TableMeta));

  restoreRows @19 (table :Text, ids :List(UInt64), values :Data, slots :List(Data), version :UInt64,
                   ages :List(UInt32)) -> ();
  # Sets rows of a table (values, and each optimizer slot: ids.size() * dim
  # float32 each): a checkpoint restored into another shard count. The
  # table's update count becomes at least `version`. ages (empty, or one per
  # id): the steps since each row was last touched, for a table whose rows
  # expire; a row without one counts as touched now.
}
