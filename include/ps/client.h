// libpsclient's connection to a set of psd shards.
//
// A Client connects to every shard of the job (one connection each), places
// tensors on them (ps/placement.h) and pulls and pushes tensors, splitting and
// reassembling the ones larger than the chunk size. All methods are safe to
// call from several threads at once. A blocking call made while no other
// call is in flight runs the network I/O on the calling thread (no hand-over
// to another thread and back); otherwise it joins the thread that is doing
// I/O, and a helper thread carries async calls to their end. Blocking
// methods and `*_async` methods returning
// std::future are both offered; buffers passed to an async call must stay
// alive (and, for pushes, unchanged) until its future is ready.
//
// Threads: calls under way at once (from several threads, or async calls
// in flight) reach psd and finish in no set order, and their futures may
// become ready in any order; a call started after another returned (or its
// future became ready) comes after it. They must not share a buffer that
// one of them writes (a pull's `out`). The destructor must not run while
// another thread is inside a method of this Client (a blocking call, or one
// starting an async call): join or stop those threads first. Async calls
// still in flight then are given up: their futures fail with
// ConnectionError ("destroyed with this call in flight"), and nothing is
// written into their buffers after the destructor returns.
//
// Example (psd running on 127.0.0.1:2222):
//   ps::ClientOptions opts;
//   opts.ps_hosts = {"127.0.0.1:2222"};
//   ps::Client client(opts);
//   client.create({{.name = "w", .shape = {2, 2}, .optimizer = ps::OptimizerConfig::sgd(0.1f)},
//                  {.name = "b", .shape = {2}}});
//   std::vector<float> w(4);
//   client.pull("w", w);                          // w = {0, 0, 0, 0}
//   client.push("w", std::vector<float>{1, 1, 1, 1});  // w -= 0.1 * grad
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/embedding.h"
#include "ps/errors.h"
#include "ps/job.h"
#include "ps/placement.h"
#include "ps/tensor_spec.h"

namespace ps {

// Whether Client::barrier waits for workers psd has lost.
enum class LostWorkers { kWaitFor, kSkip };

struct ClientOptions {
  // "host:port" or "unix:/path" per shard, in shard order (as --ps_hosts):
  // the same list on every worker. Where a psd knows its shard index and
  // count (psd --shard_index/--num_shards) and this list puts it elsewhere,
  // the constructor throws ConfigError ("ps hosts out of order") before
  // anything is created.
  std::vector<std::string> ps_hosts;
  PlacementPolicy placement = PlacementPolicy::kRoundRobin;
  // Tensors over chunk_bytes are split into chunks spread over the shards;
  // every tensor is stored and sent in parts of at most part_bytes (the
  // parts of a chunk share its shard). See ps/placement.h.
  std::size_t chunk_bytes = kDefaultChunkBytes;
  std::size_t part_bytes = kDefaultPartBytes;
  // How long to keep retrying a shard that is not (yet) listening.
  std::chrono::milliseconds connect_timeout{15000};
  // Longest wait for the answer to a call (0: no limit). Set below
  // connect_timeout, the Client raises it to connect_timeout + 10 s: a call
  // may have to wait for a connection first. wait_ready and barrier get
  // their own timeout on top. A push given up this way
  // while its gradient was still going out cuts that connection (the next
  // call reconnects): once the call has failed, nothing more is read from
  // the caller's buffer.
  std::chrono::milliseconds call_timeout{300000};
  // Asked every 100 ms, on the calling thread, by every blocking call while
  // it waits (wait_ready, barrier, checkpoint, step_done, set_ready, finish,
  // and the blocking pull, push, push_and_step, pull_rows, push_rows and
  // pull_with_rows); true gives the call up with InterruptedError. A pull
  // or push is given up as call_timeout gives it up: nothing more is
  // written into the caller's buffers nor read from them once it has
  // thrown, and the Client stays usable. A request may still be under way
  // at psd (a barrier counts this caller; a push may have been applied).
  // Must not use the Client. Not asked by the *_async calls. Python's
  // psclient sets it so that Ctrl-C ends the wait. Empty: never asked.
  std::function<bool()> interrupted;
  // When a connection breaks (psd killed, restarted), how long to keep
  // reconnecting before a call fails; 0: fail at once. Retried pushes are
  // applied once (request ids). See docs/operations.md, "Durability and
  // failures".
  std::chrono::milliseconds reconnect_timeout{30000};
  // A psd whose host vanishes (powered off, cut off by the network: no FIN
  // reaches here) is taken for gone this long after its last sign of life:
  // the connection fails, as if psd had closed it, and is reconnected as
  // above (TCP keepalive probes and TCP_USER_TIMEOUT). 0: Linux's defaults
  // (a call then waits for call_timeout). psd --dead_peer_secs is the
  // daemon's side, for workers that vanish.
  std::chrono::milliseconds dead_peer_timeout{30000};
  // Shared secret for psds started with --auth_token_file: the token itself,
  // or a file holding it (read at construction). Sent in clear text
  // unless tls_ca (below) is set.
  std::string auth_token{};
  std::string auth_token_file{};
  // TLS to psds started with --tls_cert/--tls_key (docs/operations.md,
  // "Security"): a PEM file of the CA(s) that signed their certificates
  // (only these are trusted, not the system's). Empty: plain TCP. With it,
  // every TCP connection is TLS, the token travels encrypted, and a psd
  // whose certificate does not check out is refused at once with
  // ConnectionError. Unix-socket hosts ("unix:/path") stay plaintext, and
  // a TCP host is never switched to psd's Unix socket (prefer_unix_socket
  // and shared memory do not apply).
  std::string tls_ca{};
  // The name psd's certificate must carry (a subjectAltName DNS name or IP
  // address); empty: each ps host's host part.
  std::string tls_server_name{};
  // For psds started with --tls_client_ca: this client's certificate chain
  // and private key (PEM).
  std::string tls_cert{};
  std::string tls_key{};
  int worker_index = -1;  // this worker's index in the job; -1 for tools
  bool is_chief = false;  // the one worker that initialises the model (at most one connected)
  // Largest request sent as one message (whole parts: at least one);
  // bigger requests go as several pipelined messages, so that copying,
  // sending and applying overlap.
  std::size_t max_request_bytes = 1u << 20;
  // A push that goes out as several requests (more than max_request_bytes,
  // tensors over several shards, or push_and_step reporting the step to
  // shards it has no gradient for) is checked for NaN/Inf (and in sync mode
  // for values over about FLT_MAX / replicas_to_aggregate, whose sum would
  // overflow) here before any of it is sent, since psd can only refuse the
  // request a bad value is in
  // and would apply the others. The check reads the gradients once more,
  // which costs large pushes some throughput (docs/performance.md, "Push/pull
  // against plain TCP"). A trainer that checks its
  // gradients already (as mixed-precision loss scaling does) may turn it
  // off, accepting that a NaN then fails only the requests it is in.
  bool check_split_pushes = true;
  // A psd on this machine that also listens on a Unix-domain socket (psd
  // --unix_socket) is reached through it even when ps_hosts names its TCP
  // address (large pulls move faster than over TCP, with the shared memory
  // below; docs/performance.md, "Measured results").
  // connection_addresses() says which way each shard went.
  bool prefer_unix_socket = true;
  // Over that Unix socket, tensor values of 16 KiB and more travel through
  // memory shared with psd instead of the socket: one copy on each side,
  // in user space, no kernel copies. This is the size of the region given
  // to each such psd (address space; memory is taken only as transfers use
  // it). 0: none, everything over the socket. psd --max_shared_memory_mb
  // caps it (psd says no: the socket is used).
  std::size_t shared_memory_bytes = 256u << 20;
  // While a call waits for its answer, keep asking the kernel for it for up
  // to this long before sleeping: on VMs a sleep and its wake-up are costly
  // (docs/library.md, "Busy polling"), so answers that come within tens of
  // microseconds (small tensors) arrive sooner. Adaptive: it polls less after long waits, and
  // not at all while the calling thread has had to wait for a CPU (more
  // busy threads than cores), where a poll would only slow the others.
  // psd --busy_poll_us is the daemon's side. 0: always sleep.
  std::chrono::microseconds busy_poll{50};
  // Tune glibc (mallopt, process-wide) to keep large freed blocks for reuse:
  // receiving into fresh pages costs far more than a copy into warm ones.
  bool tune_malloc = true;
};

// A tensor as the shards report it.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t version = 0;     // updates applied (smallest over its parts)
  std::vector<int> shards;  // where its parts live
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

struct WorkerStats {
  int worker_index = 0;
  int64_t step = 0;
  bool connected = false;
  uint64_t pushes = 0, stale = 0;
};

struct ShardStats {
  int shard = 0;
  std::string address;
  uint64_t tensors = 0, bytes = 0, pushes = 0, pulls = 0, rejected = 0, stale_gradients = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor bytes pushed to and pulled from the shard
  uint64_t shared_bytes =
      0;  // of those, through shared memory (ClientOptions::shared_memory_bytes)
  int64_t global_step = 0;
  uint32_t connections = 0;
  JobConfig job{};
  bool ready = false;
  bool finished = false;
  // Restored from a checkpoint and not configured by a chief since: the
  // stop step may still move (TrainingSession waits for the chief).
  bool awaiting_chief = false;
  uint64_t steps_applied = 0;    // sync: aggregated updates
  uint64_t staleness_waits = 0;  // bounded staleness: pulls that waited
  int64_t max_staleness = 0;  // bounded staleness: most steps ahead of the slowest seen at a push
  int64_t last_checkpoint_step = -1;  // -1: none written or restored
  double last_checkpoint_unix_secs = 0;
  std::vector<WorkerStats> workers;
  // What the job has waited for over a few seconds, one line each, for
  // people: "sync step 0 waits for workers 2 (never connected) ...".
  std::vector<std::string> waits;
};

struct PullResult {
  int64_t step = 0;                // global step the values were read at
  std::vector<uint64_t> versions;  // per tensor, smallest over its parts
};

enum class PushStatus { kApplied, kAccumulated, kStale, kDuplicate };

struct PushResult {
  int64_t step = 0;                // smallest global step the shards answered
  std::vector<PushStatus> status;  // per tensor; the worst over its parts
  // With done_step >= 0: shard 0's global step after counting the step, and
  // whether the job reached train_steps (as step_done() answers).
  int64_t global_step = 0;
  bool stop = false;
  std::vector<PushStatus> row_status;  // per RowGrads of push_and_step; the worst over its shards
};

// One table's part of a step's pull (Client::pull_with_rows): the rows of
// `ids` into `out`, ids.size() * dim floats, as pull_rows takes them.
struct RowsInto {
  std::string table;
  std::span<const int64_t> ids;
  std::span<float> out;
};

// One table's part of a step's push (Client::push_and_step): the gradients
// of the rows of `ids`, ids.size() * dim floats, as push_rows takes them.
struct RowGrads {
  std::string table;
  std::span<const int64_t> ids;
  std::span<const float> grads;
};

class Client {
 public:
  // Connects to every shard, retrying until connect_timeout; throws
  // ConnectionError naming the shards that could not be reached.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Places the tensors (in order) and creates them on their shards.
  // Idempotent: existing tensors of the same shape are kept as they are.
  // Over several requests, every shard first checks its whole share in one
  // request, without the values (nothing is created if one refuses, limits
  // included), which costs one more round trip. Initial values and restored
  // slots of the wrong length throw ConfigError, NaN/Inf in them
  // RequestError, before anything is sent.
  // A create that fails leaves the placement as it was (unless another
  // thread declared tensors meanwhile): the refused shape can be declared
  // as psd has it, and later tensors are placed as on other workers.
  // Over several shards, a tensor some other client created placed
  // otherwise (another placement policy, chunk_bytes or part_bytes, another
  // declaration order) throws ConfigError before anything is sent: a second
  // copy where this client places it would train apart from the first.
  void create(const std::vector<TensorSpec>& specs);
  // Places without creating: for workers that wait for the chief's init.
  void declare(const std::vector<TensorSpec>& specs);

  // Reads tensors into caller buffers (each of the tensor's element count).
  // Waits until the shards reach `min_step` (sync mode). Values are read
  // from the socket straight into the buffers: keep them alive and
  // untouched until the pull returns (or its future is ready); a pull that
  // fails leaves their contents unspecified.
  PullResult pull(const std::vector<std::string>& names, const std::vector<std::span<float>>& out,
                  int64_t min_step = 0);
  uint64_t pull(const std::string& name, std::span<float> out);
  std::vector<float> pull(const std::string& name);
  std::future<PullResult> pull_async(std::vector<std::string> names,
                                     std::vector<std::span<float>> out, int64_t min_step = 0);

  // Sends gradients; `step` is the global step the parameters were pulled at
  // (0 to kMaxStep, include/ps/job.h; psd refuses others). A gradient with
  // NaN or Inf (for a psd without --allow_nonfinite) fails the whole push
  // with RequestError and applies none of it, also when the push goes out
  // as several requests (tensors over several shards, or more than
  // max_request_bytes): the client checks such a push before sending it.
  PushResult push(const std::vector<std::string>& names,
                  const std::vector<std::span<const float>>& grads, int64_t step = 0);
  PushStatus push(const std::string& name, std::span<const float> grad);
  std::future<PushResult> push_async(std::vector<std::string> names,
                                     std::vector<std::span<const float>> grads, int64_t step = 0);
  // Pushes and, in the same calls, reports local step `done_step` as done on
  // every shard (step_done() without its extra round trips).
  PushResult push_and_step(const std::vector<std::string>& names,
                           const std::vector<std::span<const float>>& grads, int64_t step,
                           int64_t done_step);
  std::future<PushResult> push_and_step_async(std::vector<std::string> names,
                                              std::vector<std::span<const float>> grads,
                                              int64_t step, int64_t done_step);

  // pull for a step that trains tables too: the tensors and the rows of
  // each RowsInto, all requests sent at once. In sync mode all of them are
  // read at one global step, as one pull's shards are (a shard restarted
  // from an older checkpoint is read as it is), and every shard is read,
  // as push_and_step sends to every one. Returns the step read.
  //   client.pull_with_rows({"w"}, {w}, {{"user", ids, rows}}, next_step);
  PullResult pull_with_rows(const std::vector<std::string>& names,
                            const std::vector<std::span<float>>& out,
                            const std::vector<RowsInto>& rows, int64_t min_step = 0);

  // push_and_step for a step that trains tables too: the tensors' gradients,
  // each table's rows' gradients (at most one RowGrads per table) and the
  // step report go as one step. On each shard the report comes after that
  // shard's tensors and rows, so a step counted done has all of them in.
  // Checked whole first (lengths, ids, NaN/Inf): a refused call sends nothing.
  //   client.push_and_step({"w"}, {grad_w}, {{"user", ids, row_grads}}, step, local_step);
  PushResult push_and_step(const std::vector<std::string>& names,
                           const std::vector<std::span<const float>>& grads,
                           const std::vector<RowGrads>& rows, int64_t step, int64_t done_step);
  std::future<PushResult> push_and_step_async(std::vector<std::string> names,
                                              std::vector<std::span<const float>> grads,
                                              std::vector<RowGrads> rows, int64_t step,
                                              int64_t done_step);

  // --- Embedding tables (ps/embedding.h) ---
  // Creates each table's part on every shard (all shards check all tables
  // first: one refusal creates nothing). Idempotent for the same specs.
  void create_tables(const std::vector<TableSpec>& tables);
  // Knows the tables without creating them: for workers that wait for the chief.
  void declare_tables(const std::vector<TableSpec>& tables);
  // Reads the rows of `ids` into out (ids.size() * dim floats, row i at
  // out[i * dim]), each distinct id fetched once, from all its shards at
  // once. A large batch outside sync mode goes in parts of a few requests'
  // ids, each sent as soon as it is planned; an id in two parts is fetched
  // twice. A dynamic table creates rows it has not seen. Returns the global
  // step the rows were read at (waits for min_step, as pull).
  int64_t pull_rows(const std::string& table, std::span<const int64_t> ids, std::span<float> out,
                    int64_t min_step = 0);
  std::future<int64_t> pull_rows_async(std::string table, std::span<const int64_t> ids,
                                       std::span<float> out, int64_t min_step = 0);
  // Reads rows as pull_rows does, but changes no table: an id a dynamic
  // table does not hold reads as the table's initializer would make it, and
  // the rows held, their LRU order and the row limit are as before. For
  // evaluation and serving, whose held-out or unseen ids should neither grow
  // a table nor evict trained rows (a later pull_rows of such an id creates
  // it with the same values).
  //   client.lookup_rows("user", eval_ids, rows);  // as pull_rows("user", eval_ids, rows)
  int64_t lookup_rows(const std::string& table, std::span<const int64_t> ids, std::span<float> out,
                      int64_t min_step = 0);
  std::future<int64_t> lookup_rows_async(std::string table, std::span<const int64_t> ids,
                                         std::span<float> out, int64_t min_step = 0);
  // Sends the gradients of the rows of `ids` (ids.size() * dim floats); the
  // gradients of a repeated id are summed first. `step` as push's: in sync
  // mode the step the rows were pulled at (every shard gets its part, empty
  // or not, so the step completes everywhere). Returns the worst status over
  // the shards. NaN/Inf or a wrong length is refused before anything is sent.
  PushStatus push_rows(const std::string& table, std::span<const int64_t> ids,
                       std::span<const float> grads, int64_t step = 0);
  std::future<PushStatus> push_rows_async(std::string table, std::span<const int64_t> ids,
                                          std::span<const float> grads, int64_t step = 0);
  struct TableInfo {
    std::string name;
    uint32_t dim = 0;
    uint64_t rows = 0;  // fixed: the table's rows; dynamic: rows held, summed over shards
    bool dynamic = false;
    uint64_t bytes = 0;  // memory on all shards
    uint64_t evictions = 0;
    uint64_t ids_filtered = 0;  // pushed ids not yet admitted (TableSpec::min_count), summed
    uint64_t rows_expired = 0;  // rows dropped by TableSpec::expire_after_steps, summed
    std::vector<uint64_t> rows_per_shard;
  };
  std::vector<TableInfo> list_tables();
  // Sets rows of a table (values and optimizer slots, laid out as pull_rows'
  // output), each on the shard this client places it: restore_from_checkpoint
  // moves a checkpoint's rows to a job with another shard count this way.
  // ages (empty, or one per id; tables whose rows expire): the steps since
  // each row was last touched, so that it expires when it would have
  // without the restore (without: it counts as touched at the restore).
  void restore_rows(const std::string& table, std::span<const int64_t> ids,
                    std::span<const float> values, const std::vector<std::vector<float>>& slots,
                    uint64_t version, std::span<const uint32_t> ages = {});

  std::vector<TensorInfo> list();
  std::vector<ShardStats> stats();
  // Per shard, where its connection goes now: the ps_hosts entry, or
  // "unix:PATH" for a psd on this host reached over its Unix socket.
  std::vector<std::string> connection_addresses();

  // --- Job coordination (ps/training_session.h builds on these) ---
  // Chief: configures every shard (idempotent for the same config).
  void init_job(const JobConfig& config);
  // Chief: the model is created and initialised; waiting workers go on.
  void set_ready();
  // True once every shard is ready; false if `timeout` (at most an hour:
  // longer is taken as an hour) passed first.
  bool wait_ready(std::chrono::milliseconds timeout);
  // The job's configuration as last learned from the shards.
  JobConfig job() const;

  struct StepDone {
    int64_t global_step = 0;  // shard 0's global step
    bool stop = false;        // the job reached train_steps
  };
  // Reports that this worker finished local step `local_step` to every shard.
  StepDone step_done(int64_t local_step);
  std::future<StepDone> step_done_async(int64_t local_step);
  // Waits until `count` callers entered barrier `name` (held on shard 0).
  // Only callers still waiting count (one that timed out or died does not);
  // all of them must pass the same count and `lost`, another throws
  // RequestError. `timeout` is at most an hour (longer is taken as an hour).
  // LostWorkers::kSkip: of the job's workers 0..count-1, those shard 0
  // counts as gone (connections closed; in a sync job also hung past psd
  // --worker_timeout_secs) count as there, so the
  // barrier ends once every worker still in the job has come; returns how
  // many came. For a barrier after training, where a dead worker would
  // otherwise hold the others until the timeout:
  //   client.barrier("end", workers, std::chrono::seconds(60), ps::LostWorkers::kSkip);
  uint32_t barrier(const std::string& name, uint32_t count, std::chrono::milliseconds timeout,
                   LostWorkers lost = LostWorkers::kWaitFor);
  // Chief: the job is over; the shards exit once their workers disconnect.
  void finish();

  // Reports this worker's progress to every shard, for psd's /metrics and
  // status page. Fire and forget: returns without waiting for the shards, and
  // a failure is only logged (progress is advisory). Needs a worker index
  // (ClientOptions::worker_index); calls on one Client reach each shard in order.
  void report(int64_t step, float loss, float accuracy, float samples_per_sec, float learning_rate);
  struct Checkpoint {
    std::vector<std::string> paths;  // per shard, the file written
    int64_t step = 0;                // the global step saved
  };
  // Asks every shard (started with --checkpoint_dir) to write a checkpoint.
  // step >= 0 in sync mode: all shards save exactly that global step (each
  // waits for it; a step already passed is an error). step < 0: now.
  Checkpoint checkpoint(int64_t step = -1);
  // How many times a shard was found, on reconnection, to have restarted
  // (another psd process, or back at an older global step than this client
  // had seen): it may have lost what this client sent it since its last
  // checkpoint, so pulls under way read the step it has.
  uint64_t rollbacks() const;
  // The step psd had recorded for this worker index when this Client
  // connected (the most any shard had; after push_and_step(..., done_step),
  // done_step + 1: the steps done), -1 if none: where a restarted worker
  // goes on (TrainingSession does, in bounded staleness).
  int64_t recorded_step() const;

  int num_shards() const;
  const ClientOptions& options() const;
  // The placement of everything created or declared so far (a copy).
  Placement placement() const;

 private:
  // With `done`, run to the end and store the result there (no future:
  // blocking calls skip its synchronisation); without, return a future.
  std::future<PullResult> start_pull(std::vector<std::string> names,
                                     std::vector<std::span<float>> out, int64_t min_step,
                                     PullResult* done);
  std::future<PushResult> start_push(std::vector<std::string> names,
                                     std::vector<std::span<const float>> grads, int64_t step,
                                     PushResult* done, int64_t done_step = -1);

  std::future<PushResult> start_push_step(std::vector<std::string> names,
                                          std::vector<std::span<const float>> grads,
                                          std::vector<RowGrads> rows, int64_t step,
                                          int64_t done_step, PushResult* done);

  TableSpec table_spec(const std::string& table, const char* what) const;
  uint64_t row_request_bytes() const;
  // `lookup`: lookup_rows (creates nothing); else pull_rows.
  std::future<int64_t> start_pull_rows(const std::string& table, std::span<const int64_t> ids,
                                       std::span<float> out, int64_t min_step, bool lookup,
                                       int64_t* done);
  std::future<PushStatus> start_push_rows(const std::string& table, std::span<const int64_t> ids,
                                          std::span<const float> grads, int64_t step,
                                          PushStatus* done);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps
