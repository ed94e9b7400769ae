// psclient.TrainingSession: the worker's side of a job (chief initialises,
// others wait; async / sync / bounded staleness; stop at train_steps;
// restore from a checkpoint), over caller arrays bound once with
// add_variable(). Waits release the GIL; compute() runs with it held.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ps/training_session.h"
#include "python/src/bindings.h"
#include "python/src/client.h"
#include "python/src/array_buffer.h"
#include "python/src/row_arrays.h"

namespace psclient_py {
namespace {

ps::SyncMode parse_mode(const std::string& mode) {
  if (mode == "async") return ps::SyncMode::kAsync;
  if (mode == "sync") return ps::SyncMode::kSync;
  if (mode == "bounded_staleness") return ps::SyncMode::kBoundedStaleness;
  throw py::value_error("mode must be 'async', 'sync' or 'bounded_staleness', got '" + mode + "'");
}

// The session and what it points into: the client (kept open while the
// session lives) and the arrays bound to it. Destroyed with the GIL held.
struct PySession {
  std::shared_ptr<ps::Client> client;
  py::object py_client;  // its PyClient: tables added here are known there after initialize()
  std::shared_ptr<ps::WaitWatcher> watch;  // the Client's: says what checkpoint(step) waits for
  struct Variable {
    ArrayBuffer values, grads;
  };
  std::vector<Variable> variables;  // in the order of session->variable_names()
  std::vector<ps::TableSpec> tables;
  std::map<std::string, std::vector<ArrayBuffer>> rows;  // per table: the last set_rows' arrays
  std::unique_ptr<ps::TrainingSession> session;
  // What else a pull writes into that shares memory with `b` ("the values of
  // 'w'", "the rows of 't'"; empty if nothing): a pull writes every
  // variable's values and every table's rows at once, from several shards.
  // `table`: the table whose rows `b` would replace, left out.
  std::string pulled_into(const ArrayBuffer& b, const std::string& table) const {
    for (std::size_t i = 0; i < variables.size(); ++i)
      if (b.overlaps(variables[i].values))
        return "the values of '" + session->variable_names()[i] + "'";
    for (const auto& [name, arrays] : rows)
      if (name != table && b.overlaps(arrays[1])) return "the rows of '" + name + "'";
    return "";
  }
  // The call a thread is in and that thread (read and set with the GIL held).
  const char* in_call = nullptr;
  std::thread::id caller{};
  ~PySession() { session.reset(); }  // before the buffers it points into
};

// One thread drives a TrainingSession (ps/training_session.h): a call from a
// second thread while a first is in one, with the GIL released, would rebind
// or free the arrays the first one reads and writes. So it is refused. The
// same thread may call in again (run_step's compute, say).
class InCall {
 public:
  InCall(PySession& s, const char* what) : s_(s) {
    const auto me = std::this_thread::get_id();
    if (s.in_call != nullptr && s.caller != me) {
      throw std::runtime_error(std::string("TrainingSession.") + what +
                               ": another thread is in TrainingSession." + s.in_call +
                               "(); one thread drives a session (nothing was done)");
    }
    if (s.in_call == nullptr) {
      s.in_call = what;
      s.caller = me;
      owner_ = true;
    }
  }
  ~InCall() {
    if (owner_) s_.in_call = nullptr;
  }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;

 private:
  PySession& s_;
  bool owner_ = false;
};

// set_rows' arrays for one table, checked as Client.pull_rows checks its
// own: ids int64/uint64; rows (written by pulls) and grads (read by
// pushes) float32, C-contiguous, of shape ids.shape + (dim,) or (n, dim);
// rows not sharing memory with the ids.
std::vector<ArrayBuffer> rows_arrays(const ps::TableSpec& spec, py::handle ids, py::handle rows,
                                     py::handle grads) {
  const std::string& table = spec.name;
  std::vector<ArrayBuffer> b;
  b.reserve(3);
  b.push_back(ArrayBuffer::ids(ids, "set_rows: ids for '" + table + "'"));
  b.push_back(ArrayBuffer::floats(rows, true, "set_rows: rows for '" + table + "'"));
  b.push_back(ArrayBuffer::floats(grads, false, "set_rows: grads for '" + table + "'"));
  check_row_shape(spec, b[0], b[1], "set_rows: rows for '" + table + "'");
  check_row_shape(spec, b[0], b[2], "set_rows: grads for '" + table + "'");
  if (b[1].overlaps(b[0])) {
    throw py::value_error("set_rows: rows for '" + table +
                          "' share memory with the ids: a pull would overwrite the ids it is "
                          "reading (pass separate arrays)");
  }
  return b;
}

}  // namespace

void bind_training_session(py::module_& m) {
  py::class_<ps::StepOutcome>(m, "StepOutcome", "What TrainingSession.push() did.")
      .def_readonly("step", &ps::StepOutcome::step, "the global step the variables were pulled at")
      .def_readonly("global_step", &ps::StepOutcome::global_step,
                    "the job's global step after this push")
      .def_readonly("stale", &ps::StepOutcome::stale,
                    "the gradients were dropped (too late for their step)")
      .def_readonly("stop", &ps::StepOutcome::stop, "the job reached train_steps")
      .def("__repr__", [](const ps::StepOutcome& o) {
        return "StepOutcome(step=" + std::to_string(o.step) +
               ", global_step=" + std::to_string(o.global_step) +
               ", stale=" + (o.stale ? "True" : "False") + ", stop=" + (o.stop ? "True" : "False") +
               ")";
      });

  py::class_<PySession>(m, "TrainingSession",
                        R"(A worker's training loop, as TensorFlow's MonitoredTrainingSession.

    session = psclient.TrainingSession(client, mode='sync', replicas_to_aggregate=3,
                                       total_replicas=3, train_steps=1000)
    session.add_variable(spec_w, w, grad_w)   # float32 arrays: pulls land in w, pushes read grad_w
    session.add_table(user_table)             # an embedding table (TableSpec), optional
    session.initialize()                      # chief creates and initialises, others wait
    while not session.should_stop:
        session.set_rows('user', ids, rows, row_grads)  # this batch's rows (see set_rows)
        session.run_step(compute_gradients)   # pull, compute_gradients(), push
    session.end()                             # chief: psd may exit

The client needs worker_index (and is_chief for the chief). Arrays bound with
add_variable and set_rows are held by the session and must keep their storage.)")
      .def(py::init([](py::object client_obj, const std::string& mode,
                       uint32_t replicas_to_aggregate, uint32_t total_replicas,
                       uint32_t max_staleness, int64_t train_steps, double ready_timeout,
                       const std::string& restore_from) {
             if (!py::isinstance<PyClient>(client_obj)) {
               throw py::type_error(
                   "TrainingSession: client must be a psclient.Client, not " +
                   std::string(py::str(py::type::of(client_obj).attr("__name__"))));
             }
             PyClient& client = client_obj.cast<PyClient&>();
             const auto ready_ms = to_ms(ready_timeout, "ready_timeout");
             auto s = std::make_unique<PySession>();
             s->client = client.shared_client();
             s->py_client = client_obj;
             s->watch = client.watcher();
             ps::SessionOptions o;
             o.job = {parse_mode(mode), replicas_to_aggregate, total_replicas,
                      max_staleness,    train_steps,           0};
             o.ready_timeout = ready_ms;
             o.restore_from = restore_from;
             s->session = std::make_unique<ps::TrainingSession>(*s->client, std::move(o));
             return s;
           }),
           py::arg("client"), py::kw_only(), py::arg("mode") = "async",
           py::arg("replicas_to_aggregate") = 0, py::arg("total_replicas") = 0,
           py::arg("max_staleness") = 0, py::arg("train_steps") = 0,
           py::arg("ready_timeout") = 300.0, py::arg("restore_from") = "",
           "mode: 'async', 'sync' (replicas_to_aggregate gradients averaged per step) or "
           "'bounded_staleness' "
           "(max_staleness). restore_from: chief only, a checkpoint directory to start from.")
      .def(
          "add_variable",
          [](PySession& self, const ps::TensorSpec& spec, py::object values, py::object grads) {
            InCall in(self, "add_variable");
            ArrayBuffer v =
                ArrayBuffer::floats(values, true, "add_variable: values for '" + spec.name + "'");
            ArrayBuffer g =
                ArrayBuffer::floats(grads, false, "add_variable: grads for '" + spec.name + "'");
            for (const ArrayBuffer* b : {&v, &g}) {
              if (b->size() != spec.num_elements()) {
                throw py::value_error("add_variable: an array for '" + spec.name + "' has " +
                                      std::to_string(b->size()) + " elements, the tensor has " +
                                      std::to_string(spec.num_elements()) + " (shape " +
                                      ps::shape_to_string(spec.shape) + ")");
              }
            }
            if (const std::string other = self.pulled_into(v, ""); !other.empty()) {
              throw py::value_error("add_variable: values for '" + spec.name +
                                    "' share memory with " + other + " (nothing bound)");
            }
            self.session->add_variable(spec, v.span(), g.span());
            self.variables.push_back({std::move(v), std::move(g)});
          },
          py::arg("spec"), py::arg("values"), py::arg("grads"),
          "Binds a variable to arrays: pulls write `values`, pushes read `grads` (float32, the "
          "tensor's size).")
      .def(
          "add_table",
          [](PySession& self, const ps::TableSpec& spec) {
            InCall in(self, "add_table");
            self.session->add_table(spec);
            self.tables.push_back(spec);
          },
          py::arg("spec"),
          "Binds an embedding table (a TableSpec) to the session, before initialize(): the chief "
          "creates it, the others check it; each step then pulls and pushes the rows set_rows() "
          "names.")
      .def(
          "set_rows",
          [](PySession& self, const std::string& table, py::object ids, py::object rows,
             py::object grads) {
            InCall in(self, "set_rows");
            auto spec = std::find_if(self.tables.begin(), self.tables.end(),
                                     [&](const ps::TableSpec& t) { return t.name == table; });
            if (spec == self.tables.end())
              throw ps::ConfigError("set_rows: no table '" + table + "' (add_table it)");
            std::vector<ArrayBuffer> arrays = rows_arrays(*spec, ids, rows, grads);
            if (const std::string other = self.pulled_into(arrays[1], table); !other.empty()) {
              throw py::value_error("set_rows: rows for '" + table + "' share memory with " +
                                    other + " (nothing bound)");
            }
            self.session->set_rows(table, arrays[0].id_span(), arrays[1].span(), arrays[2].span());
            self.rows[table] = std::move(arrays);  // the arrays set before are let go now
          },
          py::arg("table"), py::arg("ids"), py::arg("rows"), py::arg("grads"),
          R"(The rows of a table's next steps: pull() writes the rows of `ids` into `rows`,
push() sends `grads` for them (float32 arrays of shape ids.shape + (dim,)).

    session.add_table(psclient.TableSpec("user", 16, dynamic=True))
    session.initialize()
    while not session.should_stop:
        ids = batch_ids()                                   # int64 array
        rows = np.empty(ids.shape + (16,), np.float32)
        grads = np.empty_like(rows)
        session.set_rows("user", ids, rows, grads)          # held until set again
        session.run_step(lambda: compute(rows, grads))

A table whose rows were never set is pushed empty (a sync step counts every
table). Wrong dtype, layout or shape: ValueError, nothing bound.)")
      .def(
          "initialize",
          [](PySession& self) {
            InCall in(self, "initialize");
            {
              py::gil_scoped_release nogil;
              self.session->initialize();
            }
            self.py_client.cast<PyClient&>().remember_tables(self.tables);
          },
          "Chief: configures the job, creates and initialises the variables and tables, marks "
          "the model ready. Others wait "
          "(ConnectionError after ready_timeout) and check they declared what the chief created "
          "(ConfigError). Afterwards the Client knows the tables (Client.pull_rows).")
      .def(
          "pull",
          [](PySession& self) {
            InCall in(self, "pull");
            py::gil_scoped_release nogil;
            return self.session->pull();
          },
          "Reads the variables for the next step, waiting as the mode requires; returns the global "
          "step read.")
      .def(
          "push",
          [](PySession& self) {
            InCall in(self, "push");
            py::gil_scoped_release nogil;
            return self.session->push();
          },
          "Sends the gradients for the step last pulled and reports the step done.")
      .def(
          "run_step",
          [](PySession& self, const py::function& compute) {
            InCall in(self, "run_step");
            {
              py::gil_scoped_release nogil;
              self.session->pull();
            }
            compute();
            py::gil_scoped_release nogil;
            return self.session->push();
          },
          py::arg("compute"), "pull(), compute(), push(); returns push()'s StepOutcome.")
      .def_property_readonly("should_stop",
                             [](const PySession& s) { return s.session->should_stop(); })
      .def_property_readonly("global_step",
                             [](const PySession& s) { return s.session->global_step(); })
      .def_property_readonly("local_step",
                             [](const PySession& s) { return s.session->local_step(); })
      .def_property_readonly(
          "steps_run", [](const PySession& s) { return s.session->steps_run(); },
          "Steps this session ran: local_step less where it started (a restarted worker in "
          "bounded staleness goes on from its recorded count).")
      .def_property_readonly(
          "start_step", [](const PySession& s) { return s.session->start_step(); },
          "The job's global step when initialize() started this session: 0 for a new job.")
      .def_property_readonly("stale_steps",
                             [](const PySession& s) { return s.session->stale_steps(); })
      .def_property_readonly("is_chief", [](const PySession& s) { return s.session->is_chief(); })
      .def_property_readonly(
          "variable_names", [](const PySession& s) { return s.session->variable_names(); },
          "The names of the variables added (add_variable), in order.")
      .def_property_readonly("job", [](const PySession& s) { return s.session->job(); })
      .def(
          "report",
          [](PySession& self, float loss, float accuracy, float samples_per_sec,
             float learning_rate) {
            const int64_t step = self.session->global_step();
            py::gil_scoped_release nogil;
            self.client->report(step, loss, accuracy, samples_per_sec, learning_rate);
          },
          py::arg("loss"), py::arg("accuracy") = 0.0f, py::arg("samples_per_sec") = 0.0f,
          py::arg("learning_rate") = 0.0f,
          "Reports progress at the current global step for psd's /metrics and status page (fire "
          "and forget).")
      .def(
          "checkpoint",
          [](PySession& self, int64_t step) {
            py::gil_scoped_release nogil;
            ps::WaitWatcher::Scope w(step >= 0 ? self.watch.get() : nullptr,
                                     "checkpoint (waits for its global step)",
                                     self.client->options().call_timeout);
            return self.client->checkpoint(step);
          },
          py::arg("step") = -1,
          "Client.checkpoint(): every shard writes one (psd --checkpoint_dir).")
      .def(
          "end",
          [](PySession& self) {
            InCall in(self, "end");
            py::gil_scoped_release nogil;
            self.session->end();
          },
          "Chief: tells the shards the job is over; they exit once the workers leave.");
}

}  // namespace psclient_py
