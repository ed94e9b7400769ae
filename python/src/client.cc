// psclient.Client and the values its calls return (PullResult, PushResult,
// TensorInfo, ShardStats, JobConfig, ...). Every call that waits on the
// network releases the GIL; arrays are checked (dtype, layout, size) with
// it held, before anything is sent.
// One file for psclient.Client: its calls share the argument conversions
// and the array checks at its top.
#include "python/src/client.h"

#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/errors.h"
#include "python/src/bindings.h"
#include "python/src/array_buffer.h"

namespace psclient_py {

namespace {

// The ident of Python's main thread, the one thread that runs signal
// handlers: set when the module is imported (as new_python_future's type,
// and for the same reason).
unsigned long main_thread_ident = 0;
unsigned long main_thread_id() { return main_thread_ident; }

// Clients not yet closed, closed by an atexit hook: their completer threads
// must not outlive the interpreter. Guarded by the GIL.
std::set<PyClient*>& open_clients() {
  static auto* clients = new std::set<PyClient*>;
  return *clients;
}

std::vector<std::string> to_hosts(py::handle hosts) {
  std::vector<std::string> out;
  if (py::isinstance<py::str>(hosts)) {
    const auto s = hosts.cast<std::string>();
    std::size_t start = 0;
    while (start <= s.size()) {
      std::size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      std::string host = s.substr(start, end - start);
      const auto first = host.find_first_not_of(" \t");
      const auto last = host.find_last_not_of(" \t");
      if (first != std::string::npos) out.push_back(host.substr(first, last - first + 1));
      start = end + 1;
    }
    return out;
  }
  for (py::handle h : py::iter(hosts)) out.push_back(py::str(h).cast<std::string>());
  return out;
}

uint64_t count_of(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// A call's tensors and the caller's arrays, checked.
struct Request {
  std::vector<std::string> names;
  std::vector<ArrayBuffer> buffers;
  py::object new_array;  // pull(name) without `out`: the array made for it

  std::vector<std::span<float>> out() const {
    std::vector<std::span<float>> spans;
    spans.reserve(buffers.size());
    for (const auto& b : buffers) spans.push_back(b.span());
    return spans;
  }
  std::vector<std::span<const float>> in() const {
    std::vector<std::span<const float>> spans;
    spans.reserve(buffers.size());
    for (const auto& b : buffers) spans.push_back(b.span());
    return spans;
  }
};

// pull(name, out) / pull({name: out}) / pull(name), and push's forms.
Request gather(PyClient& client, const std::string& op, py::handle tensors, py::handle array,
               bool is_pull) {
  Request r;
  auto add = [&](const std::string& name, py::handle a) {
    const std::vector<uint64_t>* shape = client.shape_of(name);
    if (shape == nullptr) {
      throw ps::ConfigError(op + ": tensor '" + name +
                            "' is unknown to this Client: create() or declare() it first");
    }
    py::object made;
    if (a.is_none()) {
      made = py::array_t<float>(std::vector<py::ssize_t>(shape->begin(), shape->end()));
      a = made;
    }
    const std::string what = op + ": " + (is_pull ? "out" : "gradient") + " for '" + name + "'";
    ArrayBuffer b = ArrayBuffer::floats(a, is_pull, what);
    const uint64_t n = count_of(*shape);
    if (b.size() != n) {
      throw py::value_error(what + " has " + std::to_string(b.size()) +
                            " elements, the tensor has " + std::to_string(n) + " (shape " +
                            ps::shape_to_string(*shape) + ")");
    }
    r.names.push_back(name);
    r.buffers.push_back(std::move(b));
    if (made) r.new_array = std::move(made);
  };
  if (py::isinstance<py::dict>(tensors)) {
    if (!array.is_none())
      throw py::type_error(op + ": pass either a name and an array, or one dict {name: array}");
    for (auto item : tensors.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first))
        throw py::type_error(op + ": dict keys must be tensor names (str)");
      if (item.second.is_none()) throw py::type_error(op + ": dict values must be arrays");
      add(item.first.cast<std::string>(), item.second);
    }
  } else if (py::isinstance<py::str>(tensors)) {
    if (array.is_none() && !is_pull) {
      throw py::type_error(op + ": gradient missing: " + op + "(name, grad) or " + op +
                           "({name: grad})");
    }
    add(tensors.cast<std::string>(), array);
  } else {
    throw py::type_error(op + ": expected a tensor name (str) or a dict {name: array}, got " +
                         std::string(py::str(py::type::handle_of(tensors).attr("__name__"))));
  }
  if (is_pull && r.buffers.size() > 1) {
    // Two pulls into the same memory would race: which tensor's values it
    // ends up holding depends on which shard answers last.
    std::vector<const ArrayBuffer*> outs;
    for (const ArrayBuffer& b : r.buffers) outs.push_back(&b);
    if (auto both = ArrayBuffer::first_overlap(outs)) {
      throw py::value_error(op + ": the outs for '" + r.names[both->first] + "' and '" +
                            r.names[both->second] + "' share memory (nothing was sent)");
    }
  }
  return r;
}

ps::SyncMode to_mode(py::handle mode) {
  if (py::isinstance<ps::SyncMode>(mode)) return mode.cast<ps::SyncMode>();
  const auto s = py::str(mode).cast<std::string>();
  if (s == "async") return ps::SyncMode::kAsync;
  if (s == "sync") return ps::SyncMode::kSync;
  if (s == "bounded_staleness") return ps::SyncMode::kBoundedStaleness;
  throw py::value_error(
      "mode must be 'async', 'sync' or 'bounded_staleness' (or a psclient.SyncMode), got '" + s +
      "'");
}

const char* kPullDoc = R"(Reads tensors into arrays, in place.

    pull('w', out)              # out: C-contiguous float32 NumPy array / torch CPU tensor
    pull({'w': w, 'b': b})      # several at once, one round trip per shard
    w = pull('w')               # a new NumPy array of the tensor's shape

min_step: wait until the shards reach this global step (sync mode).
Returns a PullResult (step, versions), or the new array. The GIL is
released while waiting. Wrong dtype, layout or size: ValueError, nothing sent.)";

const char* kPushDoc = R"(Sends gradients: push('w', grad) or push({'w': gw, 'b': gb}).

step: the global step the parameters were pulled at. Returns a PushResult
(step, status per tensor, ...). A NaN/Inf gradient raises RequestError and
applies nothing. Wrong dtype, layout or size: ValueError, nothing sent.)";

}  // namespace

std::chrono::milliseconds to_ms(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 1e9) {
    throw py::value_error(std::string(what) + " must be a number of seconds >= 0 and <= 1e9, got " +
                          std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

PyClient::PyClient(ps::ClientOptions options)
    : client_(std::make_shared<ps::Client>(std::move(options))),
      watch_(std::make_shared<ps::WaitWatcher>(*client_, client_->options().worker_index)) {}

PyClient::~PyClient() { close(OnCtrlC::kStopWaiting); }

namespace {
// Whether Ctrl-C came, asked where no exception may be raised (a Client
// dropped: its destructor): the SIGINT is taken and set pending again, so
// that Python raises KeyboardInterrupt at its next chance, as it would have.
bool sigint_pending() {
  if (PyThread_get_thread_ident() != main_thread_id()) return false;
  py::gil_scoped_acquire gil;
  if (!PyOS_InterruptOccurred()) return false;
  PyErr_SetInterrupt();
  return true;
}
}  // namespace

ps::Client& PyClient::client() {
  if (!client_) throw py::value_error("the Client is closed");
  return *client_;
}

std::shared_ptr<ps::Client> PyClient::shared_client() {
  if (!client_) throw py::value_error("the Client is closed");
  return client_;
}

void PyClient::close(OnCtrlC on_ctrl_c) {
  open_clients().erase(this);
  std::function<bool()> interrupted;
  if (on_ctrl_c == OnCtrlC::kStopWaiting) interrupted = sigint_pending;
  if (on_ctrl_c == OnCtrlC::kRaise && client_) interrupted = client_->options().interrupted;
  // Closed from a done-callback: the calls queued behind it still need the
  // connection; it closes once they are completed.
  if (client_) async_calls_.keep_until_completed(client_);
  const bool completed = async_calls_.stop(interrupted);
  std::shared_ptr<ps::Client> c = std::move(client_);
  std::shared_ptr<ps::WaitWatcher> w = std::move(watch_);
  {
    py::gil_scoped_release nogil;
    w.reset();  // its thread stops (a call under way holds it until it returns)
    c.reset();  // disconnects, unless a call in another thread or a TrainingSession still holds it
  }
  if (!completed) {
    // Interrupted: the calls fail now that the connections are gone; their
    // futures are set before this returns (a second Ctrl-C stops waiting).
    // A dropped Client's own member waits for them as it goes (~AsyncCalls):
    // they fail soon, the connections being closed.
    if (on_ctrl_c == OnCtrlC::kRaise) {
      async_calls_.stop(interrupted);
      throw py::error_already_set();
    }
  }
}

const std::vector<uint64_t>* PyClient::shape_of(const std::string& name) {
  auto it = shapes_.find(name);
  if (it != shapes_.end()) return &it->second;
  if (!client_) return nullptr;
  const ps::Placement placement = client_->placement();
  for (const auto& t : placement.tensors()) shapes_.emplace(t.spec.name, t.spec.shape);
  it = shapes_.find(name);
  return it == shapes_.end() ? nullptr : &it->second;
}

const ps::TableSpec* PyClient::table_of(const std::string& name) const {
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : &it->second;
}

void PyClient::remember_tables(const std::vector<ps::TableSpec>& tables) {
  for (const auto& t : tables) tables_[t.name] = t;
}

void bind_client(py::module_& m) {
  main_thread_ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  init_async_calls();
  py::enum_<ps::SyncMode>(m, "SyncMode", "How the workers of one job share updates.")
      .value("ASYNC", ps::SyncMode::kAsync, "every push applied on arrival")
      .value("SYNC", ps::SyncMode::kSync, "average replicas_to_aggregate gradients per step")
      .value("BOUNDED_STALENESS", ps::SyncMode::kBoundedStaleness,
             "async, no worker more than max_staleness steps ahead of the slowest");

  py::class_<ps::JobConfig>(
      m, "JobConfig", "How a job trains; chosen by the chief (Client.init_job, TrainingSession).")
      .def(py::init([](py::object mode, uint32_t replicas_to_aggregate, uint32_t total_replicas,
                       uint32_t max_staleness, int64_t train_steps, int64_t start_step) {
             return ps::JobConfig{to_mode(mode), replicas_to_aggregate, total_replicas,
                                  max_staleness, train_steps,           start_step};
           }),
           py::kw_only(), py::arg("mode") = ps::SyncMode::kAsync,
           py::arg("replicas_to_aggregate") = 0, py::arg("total_replicas") = 0,
           py::arg("max_staleness") = 0, py::arg("train_steps") = 0, py::arg("start_step") = 0)
      .def_readwrite("mode", &ps::JobConfig::mode)
      .def_readwrite("replicas_to_aggregate", &ps::JobConfig::replicas_to_aggregate)
      .def_readwrite("total_replicas", &ps::JobConfig::total_replicas)
      .def_readwrite("max_staleness", &ps::JobConfig::max_staleness)
      .def_readwrite("train_steps", &ps::JobConfig::train_steps)
      .def_readwrite("start_step", &ps::JobConfig::start_step)
      .def(py::self == py::self)
      .def("__repr__",
           [](const ps::JobConfig& c) { return "JobConfig(" + ps::to_string(c) + ")"; });

  py::enum_<ps::PushStatus>(m, "PushStatus", "What a shard did with a pushed gradient.")
      .value("APPLIED", ps::PushStatus::kApplied)
      .value("ACCUMULATED", ps::PushStatus::kAccumulated, "sync: added to its step's sum")
      .value("STALE", ps::PushStatus::kStale, "sync: too late for its step, dropped")
      .value("DUPLICATE", ps::PushStatus::kDuplicate, "a retried request already applied");

  py::class_<ps::PullResult>(m, "PullResult",
                             "What a pull read: the global step and each tensor's version.")
      .def_readonly("step", &ps::PullResult::step)
      .def_readonly("versions", &ps::PullResult::versions)
      .def("__repr__", [](const ps::PullResult& r) {
        return "PullResult(step=" + std::to_string(r.step) +
               ", versions=" + std::string(py::str(py::cast(r.versions))) + ")";
      });
  py::class_<ps::PushResult>(m, "PushResult",
                             "What a push did: per tensor status, and the step it reported.")
      .def_readonly("step", &ps::PushResult::step)
      .def_readonly("status", &ps::PushResult::status)
      .def_readonly("global_step", &ps::PushResult::global_step)
      .def_readonly("stop", &ps::PushResult::stop)
      .def("__repr__", [](const ps::PushResult& r) {
        return "PushResult(step=" + std::to_string(r.step) +
               ", status=" + std::string(py::str(py::cast(r.status))) +
               ", global_step=" + std::to_string(r.global_step) +
               ", stop=" + (r.stop ? "True" : "False") + ")";
      });
  py::class_<ps::Client::StepDone>(m, "StepDone")
      .def_readonly("global_step", &ps::Client::StepDone::global_step)
      .def_readonly("stop", &ps::Client::StepDone::stop);
  py::class_<ps::Client::Checkpoint>(m, "Checkpoint")
      .def_readonly("paths", &ps::Client::Checkpoint::paths, "per shard, the file written")
      .def_readonly("step", &ps::Client::Checkpoint::step);
  py::class_<ps::TensorInfo>(m, "TensorInfo")
      .def_readonly("name", &ps::TensorInfo::name)
      .def_property_readonly("shape",
                             [](const ps::TensorInfo& t) { return py::tuple(py::cast(t.shape)); })
      .def_readonly("version", &ps::TensorInfo::version)
      .def_readonly("shards", &ps::TensorInfo::shards)
      .def_readonly("optimizer", &ps::TensorInfo::optimizer)
      .def("__repr__", [](const ps::TensorInfo& t) {
        return "TensorInfo('" + t.name + "', " + ps::shape_to_string(t.shape) +
               ", version=" + std::to_string(t.version) + ")";
      });
  py::class_<ps::WorkerStats>(m, "WorkerStats")
      .def_readonly("worker_index", &ps::WorkerStats::worker_index)
      .def_readonly("step", &ps::WorkerStats::step)
      .def_readonly("connected", &ps::WorkerStats::connected)
      .def_readonly("pushes", &ps::WorkerStats::pushes)
      .def_readonly("stale", &ps::WorkerStats::stale);
  py::class_<ps::ShardStats>(m, "ShardStats", "One shard's counters (Client.stats()).")
      .def_readonly("shard", &ps::ShardStats::shard)
      .def_readonly("address", &ps::ShardStats::address)
      .def_readonly("tensors", &ps::ShardStats::tensors)
      .def_readonly("bytes", &ps::ShardStats::bytes)
      .def_readonly("pushes", &ps::ShardStats::pushes)
      .def_readonly("pulls", &ps::ShardStats::pulls)
      .def_readonly("rejected", &ps::ShardStats::rejected)
      .def_readonly("stale_gradients", &ps::ShardStats::stale_gradients)
      .def_readonly("bytes_in", &ps::ShardStats::bytes_in)
      .def_readonly("bytes_out", &ps::ShardStats::bytes_out)
      .def_readonly("shared_bytes", &ps::ShardStats::shared_bytes)
      .def_readonly("global_step", &ps::ShardStats::global_step)
      .def_readonly("connections", &ps::ShardStats::connections)
      .def_readonly("job", &ps::ShardStats::job)
      .def_readonly("ready", &ps::ShardStats::ready)
      .def_readonly("finished", &ps::ShardStats::finished)
      .def_readonly("steps_applied", &ps::ShardStats::steps_applied)
      .def_readonly("workers", &ps::ShardStats::workers);

  py::class_<PyClient>(m, "Client", R"(A connection to every psd shard of a job.

    with psclient.Client(['127.0.0.1:2222']) as client:
        client.create([psclient.TensorSpec('w', (2, 2), optimizer=psclient.sgd(0.1))])
        w = numpy.zeros((2, 2), numpy.float32)
        client.pull('w', w)                                # in place
        client.push('w', numpy.ones((2, 2), numpy.float32))  # w -= 0.1 * grad

Safe to use from several threads. Timeouts are in seconds. ps_hosts: a list
of "host:port" / "unix:/path", or one comma-separated string (--ps_hosts).)")
      .def(py::init([](py::object ps_hosts, int worker_index, bool is_chief,
                       std::optional<std::string> auth_token,
                       std::optional<std::string> auth_token_file, double connect_timeout,
                       double call_timeout, double reconnect_timeout, double dead_peer_timeout,
                       const std::string& placement, std::size_t chunk_bytes,
                       std::size_t part_bytes, std::size_t max_request_bytes,
                       bool check_split_pushes, bool prefer_unix_socket,
                       std::size_t shared_memory_bytes, double busy_poll_us, bool tune_malloc,
                       std::optional<std::string> tls_ca,
                       std::optional<std::string> tls_server_name) {
             ps::ClientOptions o;
             o.ps_hosts = to_hosts(ps_hosts);
             o.worker_index = worker_index;
             o.is_chief = is_chief;
             if (auth_token) o.auth_token = *auth_token;
             if (auth_token_file) o.auth_token_file = *auth_token_file;
             o.connect_timeout = to_ms(connect_timeout, "connect_timeout");
             o.call_timeout = to_ms(call_timeout, "call_timeout");
             o.reconnect_timeout = to_ms(reconnect_timeout, "reconnect_timeout");
             o.dead_peer_timeout = to_ms(dead_peer_timeout, "dead_peer_timeout");
             if (placement == "round_robin") {
               o.placement = ps::PlacementPolicy::kRoundRobin;
             } else if (placement == "greedy_bytes") {
               o.placement = ps::PlacementPolicy::kGreedyBytes;
             } else {
               throw py::value_error("placement must be 'round_robin' or 'greedy_bytes', got '" +
                                     placement + "'");
             }
             o.chunk_bytes = chunk_bytes;
             o.part_bytes = part_bytes;
             o.max_request_bytes = max_request_bytes;
             o.check_split_pushes = check_split_pushes;
             o.prefer_unix_socket = prefer_unix_socket;
             o.shared_memory_bytes = shared_memory_bytes;
             if (!(busy_poll_us >= 0) || busy_poll_us > 1e15)
               throw py::value_error("busy_poll_us must be >= 0 and <= 1e15");
             o.busy_poll = std::chrono::microseconds(static_cast<int64_t>(busy_poll_us));
             o.tune_malloc = tune_malloc;
             if (tls_ca) o.tls_ca = *tls_ca;
             if (tls_server_name) o.tls_server_name = *tls_server_name;
             // Ctrl-C ends a wait (barrier, wait_ready, a blocking pull, ...):
             // Python's signal handlers run here, on the waiting thread, and
             // the exception one raises is what the call raises (errors.cc).
             // Only the main thread runs them: a call waiting on another
             // thread does not take the GIL every 100 ms to learn nothing.
             o.interrupted = [main = main_thread_id()] {
               if (PyThread_get_thread_ident() != main) return false;
               py::gil_scoped_acquire gil;
               return PyErr_CheckSignals() != 0;
             };
             std::unique_ptr<PyClient> c;
             {
               py::gil_scoped_release nogil;
               c = std::make_unique<PyClient>(std::move(o));
             }
             open_clients().insert(c.get());
             return c;
           }),
           py::arg("ps_hosts"), py::kw_only(), py::arg("worker_index") = -1,
           py::arg("is_chief") = false, py::arg("auth_token") = py::none(),
           py::arg("auth_token_file") = py::none(), py::arg("connect_timeout") = 15.0,
           py::arg("call_timeout") = 300.0, py::arg("reconnect_timeout") = 30.0,
           py::arg("dead_peer_timeout") = 30.0, py::arg("placement") = "round_robin",
           py::arg("chunk_bytes") = ps::kDefaultChunkBytes,
           py::arg("part_bytes") = ps::kDefaultPartBytes,
           py::arg("max_request_bytes") = std::size_t{1} << 20,
           py::arg("check_split_pushes") = true, py::arg("prefer_unix_socket") = true,
           py::arg("shared_memory_bytes") = std::size_t{256} << 20, py::arg("busy_poll_us") = 50.0,
           py::arg("tune_malloc") = true, py::arg("tls_ca") = py::none(),
           py::arg("tls_server_name") = py::none(),
           "Connects to every shard, retrying until connect_timeout; ConnectionError names those "
           "not reached.")
      .def(
          "close", [](PyClient& self) { self.close(); },
          "Waits for async calls under way, then closes the connections (idempotent). Ctrl-C stops "
          "the wait: the connections close, the calls still under way fail, and KeyboardInterrupt "
          "is raised.")
      .def_property_readonly("closed", &PyClient::closed)
      .def(
          "__enter__", [](PyClient& self) -> PyClient& { return self; },
          py::return_value_policy::reference)
      .def("__exit__", [](PyClient& self, py::args) { self.close(); })

      .def(
          "create",
          [](PyClient& self, const std::vector<ps::TensorSpec>& specs) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->create(specs);
          },
          py::arg("specs"),
          "Places the tensors (in order) and creates them on their shards; existing tensors of the "
          "same shape are "
          "kept.")
      .def(
          "declare",
          [](PyClient& self, const std::vector<ps::TensorSpec>& specs) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->declare(specs);
          },
          py::arg("specs"),
          "Places the tensors without creating them (workers that wait for the chief).")

      .def(
          "pull",
          [](PyClient& self, py::object tensors, py::object out, int64_t min_step) -> py::object {
            auto c = self.shared_client();
            auto watch = self.watcher();  // with the GIL: close() may move it
            Request r = gather(self, "pull", tensors, out, true);
            const auto spans = r.out();
            ps::PullResult result;
            {
              py::gil_scoped_release nogil;
              ps::WaitWatcher::Scope w(min_step > 0 ? watch.get() : nullptr,
                                       "pull (waits for min_step)", c->options().call_timeout);
              result = c->pull(r.names, spans, min_step);
            }
            if (r.new_array) return r.new_array;
            return py::cast(std::move(result));
          },
          py::arg("tensors"), py::arg("out") = py::none(), py::kw_only(), py::arg("min_step") = 0,
          kPullDoc)
      .def(
          "pull_async",
          [](PyClient& self, py::object tensors, py::object out, int64_t min_step) {
            auto c = self.shared_client();
            Request r = gather(self, "pull_async", tensors, out, true);
            std::future<ps::PullResult> future;
            {
              py::gil_scoped_release nogil;
              future = c->pull_async(r.names, r.out(), min_step);
            }
            py::object made = r.new_array;
            return start_async(self.async_calls(), std::move(future), std::move(r.buffers),
                               [made](ps::PullResult&& result) -> py::object {
                                 if (made) return made;
                                 return py::cast(std::move(result));
                               });
          },
          py::arg("tensors"), py::arg("out") = py::none(), py::kw_only(), py::arg("min_step") = 0,
          "pull() without waiting: returns a concurrent.futures.Future of its result. Leave the "
          "arrays alone until "
          "it is done.")
      .def(
          "push",
          [](PyClient& self, py::object tensors, py::object grad, int64_t step) {
            auto c = self.shared_client();
            Request r = gather(self, "push", tensors, grad, false);
            const auto spans = r.in();
            py::gil_scoped_release nogil;
            return c->push(r.names, spans, step);
          },
          py::arg("tensors"), py::arg("grad") = py::none(), py::kw_only(), py::arg("step") = 0,
          kPushDoc)
      .def(
          "push_async",
          [](PyClient& self, py::object tensors, py::object grad, int64_t step) {
            auto c = self.shared_client();
            Request r = gather(self, "push_async", tensors, grad, false);
            std::future<ps::PushResult> future;
            {
              py::gil_scoped_release nogil;
              future = c->push_async(r.names, r.in(), step);
            }
            return start_async(self.async_calls(), std::move(future), std::move(r.buffers),
                               [](ps::PushResult&& result) { return py::cast(std::move(result)); });
          },
          py::arg("tensors"), py::arg("grad") = py::none(), py::kw_only(), py::arg("step") = 0,
          "push() without waiting: returns a concurrent.futures.Future of its PushResult. Leave "
          "the gradients "
          "unchanged until it is done.")
      .def(
          "push_and_step",
          [](PyClient& self, py::object tensors, py::object grad, int64_t step, int64_t done_step) {
            auto c = self.shared_client();
            Request r = gather(self, "push_and_step", tensors, grad, false);
            const auto spans = r.in();
            py::gil_scoped_release nogil;
            return c->push_and_step(r.names, spans, step, done_step);
          },
          py::arg("tensors"), py::arg("grad") = py::none(), py::kw_only(), py::arg("step"),
          py::arg("done_step"),
          "Pushes and, in the same requests, reports local step done_step as done (step_done() "
          "without its round "
          "trips). Needs a worker_index.")
      .def(
          "push_and_step_async",
          [](PyClient& self, py::object tensors, py::object grad, int64_t step, int64_t done_step) {
            auto c = self.shared_client();
            Request r = gather(self, "push_and_step_async", tensors, grad, false);
            std::future<ps::PushResult> future;
            {
              py::gil_scoped_release nogil;
              future = c->push_and_step_async(r.names, r.in(), step, done_step);
            }
            return start_async(self.async_calls(), std::move(future), std::move(r.buffers),
                               [](ps::PushResult&& result) { return py::cast(std::move(result)); });
          },
          py::arg("tensors"), py::arg("grad") = py::none(), py::kw_only(), py::arg("step"),
          py::arg("done_step"),
          "push_and_step() without waiting: a concurrent.futures.Future of its PushResult.")

      .def(
          "list",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            return c->list();
          },
          "The tensors as the shards report them.")
      .def(
          "stats",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            return c->stats();
          },
          "Every shard's counters.")
      .def(
          "connection_addresses",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            return c->connection_addresses();
          },
          "Per shard, where its connection goes: the ps_hosts entry or 'unix:PATH'.")
      .def(
          "init_job",
          [](PyClient& self, const ps::JobConfig& job) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->init_job(job);
          },
          py::arg("job"), "Chief: configures every shard (idempotent for the same JobConfig).")
      .def(
          "set_ready",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->set_ready();
          },
          "Chief: the model is created and initialised; waiting workers go on.")
      .def(
          "wait_ready",
          [](PyClient& self, double timeout) {
            auto c = self.shared_client();
            auto watch = self.watcher();  // with the GIL: close() may move it
            const auto ms = to_ms(timeout, "timeout");
            py::gil_scoped_release nogil;
            ps::WaitWatcher::Scope w(
                watch.get(), "wait_ready: waiting for the chief to initialise the model", ms);
            return c->wait_ready(ms);
          },
          py::arg("timeout"),
          "True once every shard is ready; False if timeout (seconds) passed first.")
      .def_property_readonly(
          "job", [](PyClient& self) { return self.client().job(); },
          "The job's configuration as last learned from the shards.")
      .def(
          "step_done",
          [](PyClient& self, int64_t local_step) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            return c->step_done(local_step);
          },
          py::arg("local_step"),
          "Reports that this worker finished local_step; returns StepDone(global_step, stop).")
      .def(
          "step_done_async",
          [](PyClient& self, int64_t local_step) {
            auto c = self.shared_client();
            std::future<ps::Client::StepDone> future;
            {
              py::gil_scoped_release nogil;
              future = c->step_done_async(local_step);
            }
            return start_async(self.async_calls(), std::move(future), {},
                               [](ps::Client::StepDone&& d) { return py::cast(std::move(d)); });
          },
          py::arg("local_step"),
          "step_done() without waiting: a concurrent.futures.Future of its StepDone.")
      .def(
          "barrier",
          [](PyClient& self, const std::string& name, uint32_t count, double timeout,
             bool skip_lost_workers) {
            auto c = self.shared_client();
            auto watch = self.watcher();  // with the GIL: close() may move it
            const auto ms = to_ms(timeout, "timeout");
            py::gil_scoped_release nogil;
            ps::WaitWatcher::Scope w(watch.get(), "barrier", ms);
            return c->barrier(
                name, count, ms,
                skip_lost_workers ? ps::LostWorkers::kSkip : ps::LostWorkers::kWaitFor);
          },
          py::arg("name"), py::arg("count"), py::arg("timeout") = 60.0, py::kw_only(),
          py::arg("skip_lost_workers") = false,
          R"(Waits until `count` callers entered barrier `name` (held on shard 0); returns how many came.
Every caller passes the same count and skip_lost_workers (RequestError otherwise).
skip_lost_workers: of the job's workers 0..count-1, those psd counts as gone (connections
closed; in a sync job also hung past psd --worker_timeout_secs) count as there, so the barrier ends once every worker still in
the job has come, not at the timeout: for a barrier after training.)")
      .def(
          "finish",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->finish();
          },
          "Chief: the job is over; the shards exit once their workers disconnect.")
      .def(
          "report",
          [](PyClient& self, int64_t step, float loss, float accuracy, float samples_per_sec,
             float learning_rate) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            c->report(step, loss, accuracy, samples_per_sec, learning_rate);
          },
          py::arg("step"), py::arg("loss"), py::arg("accuracy") = 0.0f,
          py::arg("samples_per_sec") = 0.0f, py::arg("learning_rate") = 0.0f,
          "Reports this worker's progress for psd's /metrics and status page (fire and forget; "
          "needs a "
          "worker_index).")
      .def(
          "checkpoint",
          [](PyClient& self, int64_t step) {
            auto c = self.shared_client();
            auto watch = self.watcher();  // with the GIL: close() may move it
            py::gil_scoped_release nogil;
            ps::WaitWatcher::Scope w(step >= 0 ? watch.get() : nullptr,
                        "checkpoint (waits for its global step)", c->options().call_timeout);
            return c->checkpoint(step);
          },
          py::arg("step") = -1,
          "Asks every shard (psd --checkpoint_dir) to write a checkpoint: now (step < 0) or, in "
          "sync mode, at "
          "that global step.")
      .def_property_readonly("rollbacks", [](PyClient& self) { return self.client().rollbacks(); })
      .def_property_readonly("recorded_step",
                             [](PyClient& self) { return self.client().recorded_step(); })
      .def_property_readonly("num_shards",
                             [](PyClient& self) { return self.client().num_shards(); })
      .def_property_readonly("ps_hosts",
                             [](PyClient& self) { return self.client().options().ps_hosts; })
      .def_property_readonly("worker_index",
                             [](PyClient& self) { return self.client().options().worker_index; })
      .def_property_readonly("is_chief",
                             [](PyClient& self) { return self.client().options().is_chief; });

  // Before the interpreter goes: complete pending futures, end the threads.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    const std::set<PyClient*> clients = open_clients();
    for (PyClient* c : clients) c->close(PyClient::OnCtrlC::kIgnore);
  }));
}

}  // namespace psclient_py
