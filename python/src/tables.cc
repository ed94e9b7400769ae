// Embedding tables for Python (ps/embedding.h): TableSpec, RowOptimizerConfig
// and the Client's table calls (create_tables, pull_rows, push_rows, their
// *_async forms, list_tables). Ids are int64 or uint64 arrays of any shape;
// rows are float32 arrays of shape ids.shape + (dim,) (or (ids.size, dim)),
// checked with the GIL held before anything is sent; the calls wait with
// it released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/first_positions.h"
#include "ps/embedding.h"
#include "ps/errors.h"
#include "python/src/array_buffer.h"
#include "python/src/async_calls.h"
#include "python/src/bindings.h"
#include "python/src/client.h"
#include "python/src/row_arrays.h"

namespace psclient_py {
namespace {

std::string shape_string(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

void check_row_shape(const ps::TableSpec& spec, const ArrayBuffer& ids, const ArrayBuffer& rows,
                     const std::string& what) {
  const auto n = static_cast<py::ssize_t>(ids.size());
  const auto dim = static_cast<py::ssize_t>(spec.dim);
  std::vector<py::ssize_t> want = ids.shape();
  want.push_back(dim);
  const std::vector<py::ssize_t> flat = {n, dim};
  const auto& shape = rows.shape();
  if (shape != want && shape != flat) {
    throw py::value_error(what + " has shape " + shape_string(shape) + "; " + std::to_string(n) +
                          " ids of table '" + spec.name + "' (dim " + std::to_string(dim) +
                          ") need " + shape_string(want) +
                          (want == flat ? "" : " or " + shape_string(flat)));
  }
}

namespace {

ps::TablePlacement to_placement(const std::string& s) {
  if (s == "mod") return ps::TablePlacement::kMod;
  if (s == "div") return ps::TablePlacement::kDiv;
  if (s == "hash") return ps::TablePlacement::kHash;
  throw py::value_error("placement must be 'mod', 'div' or 'hash', got '" + s + "'");
}

ps::OnRowLimit to_on_limit(const std::string& s) {
  if (s == "refuse") return ps::OnRowLimit::kRefuse;
  if (s == "evict_lru") return ps::OnRowLimit::kEvictLru;
  throw py::value_error("on_limit must be 'refuse' or 'evict_lru', got '" + s + "'");
}

std::string repr(const ps::RowOptimizerConfig& o) {
  static const char* names[] = {"sgd", "adagrad", "lazy_adam", "ftrl"};
  return std::string("RowOptimizerConfig(") + names[static_cast<int>(o.kind)] +
         ", learning_rate=" + std::to_string(o.learning_rate) + ")";
}

// A row call's ids and rows, checked against the table: ids int64/uint64,
// rows float32 C-contiguous of shape ids.shape + (dim,) or (ids.size, dim).
struct RowRequest {
  ps::TableSpec spec;
  std::vector<ArrayBuffer> buffers;  // [ids, rows]
  py::object new_array;              // pull_rows(table, ids) without `out`

  std::span<const int64_t> ids() const { return buffers[0].id_span(); }
  std::span<float> rows() const { return buffers[1].span(); }
};

RowRequest gather_rows(PyClient& self, const std::string& op, const std::string& table,
                       py::handle ids, py::handle rows, bool is_pull) {
  const ps::TableSpec* spec = self.table_of(table);
  if (spec == nullptr) {
    throw ps::ConfigError(op + ": no table '" + table +
                          "' on this Client (create_tables or declare_tables first)");
  }
  RowRequest r{*spec, {}, {}};
  r.buffers.reserve(2);  // id_buffer below stays valid
  r.buffers.push_back(ArrayBuffer::ids(ids, op + ": ids for '" + table + "'"));
  const ArrayBuffer& id_buffer = r.buffers[0];
  if (rows.is_none()) {
    std::vector<py::ssize_t> want = id_buffer.shape();
    want.push_back(static_cast<py::ssize_t>(spec->dim));
    r.new_array = py::array_t<float>(want);
    rows = r.new_array;
  }
  const std::string what = op + ": " + (is_pull ? "out" : "grads") + " for '" + table + "'";
  r.buffers.push_back(ArrayBuffer::floats(rows, is_pull, what));
  // libpsclient reads the ids while rows arrive (a large pull plans its
  // parts as earlier ones land): rows written over them would be ids never
  // checked, and a shard index out of range.
  if (is_pull && r.buffers[1].overlaps(id_buffer)) {
    throw py::value_error(what +
                          " shares memory with the ids: a pull would overwrite the ids it "
                          "is reading (pass separate arrays)");
  }
  check_row_shape(*spec, id_buffer, r.buffers[1], what);
  // Unsigned ids keep their 64 bits; a fixed table's range is checked here
  // so that the message shows them as the caller wrote them.
  if (id_buffer.unsigned_ids() && !spec->dynamic) {
    for (int64_t id : id_buffer.id_span()) {
      if (static_cast<uint64_t>(id) >= spec->rows) {
        throw ps::RequestError(op + ": id " + std::to_string(static_cast<uint64_t>(id)) +
                               " is outside table '" + table + "' of " +
                               std::to_string(spec->rows) + " rows (nothing was sent)");
      }
    }
  }
  return r;
}

const char* kPullRowsDoc = R"(Reads rows of an embedding table, in place.

    client.pull_rows('user', ids, out)   # ids: int64/uint64 array (NumPy or torch), any shape
                                         # out: float32, shape ids.shape + (dim,), C-contiguous,
                                         # not sharing memory with ids
    rows = client.pull_rows('user', ids) # a new array of shape ids.shape + (dim,)

Each distinct id is fetched once (a large pull outside sync mode goes in
parts, each fetching its own distinct ids); a dynamic table creates rows it
has not seen. min_step: wait until the shards reach this global step (sync mode).
Returns the global step the rows were read at, or the new array. Wrong
dtype, layout or shape: ValueError, nothing sent. The GIL is released while waiting.)";

const char* kLookupRowsDoc =
    R"(Reads rows of an embedding table as pull_rows does, changing no table.

    probs = model(client.lookup_rows('user', eval_ids))  # evaluation, serving

An id a dynamic table does not hold reads as the table's initializer would
make it; no row is created, none is evicted or moved in the LRU order, and
the row limit does not apply. A later pull_rows of such an id creates it
with the same values. Arguments, result and refusals as pull_rows'.)";

// pull_rows and lookup_rows (`lookup`), blocking: the step, or the new array.
py::object read_rows(PyClient& self, bool lookup, const std::string& table, py::object ids,
                     py::object out, int64_t min_step) {
  const char* what = lookup ? "lookup_rows" : "pull_rows";
  auto c = self.shared_client();
  auto watch = self.watcher();  // with the GIL: close() may move it
  RowRequest r = gather_rows(self, what, table, ids, out, true);
  int64_t step = 0;
  {
    py::gil_scoped_release nogil;
    ps::WaitWatcher::Scope w(
        min_step > 0 ? watch.get() : nullptr,
        lookup ? "lookup_rows (waits for min_step)" : "pull_rows (waits for min_step)",
        c->options().call_timeout);
    step = lookup ? c->lookup_rows(table, r.ids(), r.rows(), min_step)
                  : c->pull_rows(table, r.ids(), r.rows(), min_step);
  }
  if (r.new_array) return r.new_array;
  return py::int_(step);
}

// The same, as a concurrent.futures.Future.
py::object read_rows_async(PyClient& self, bool lookup, const std::string& table, py::object ids,
                           py::object out, int64_t min_step) {
  auto c = self.shared_client();
  RowRequest r =
      gather_rows(self, lookup ? "lookup_rows_async" : "pull_rows_async", table, ids, out, true);
  std::future<int64_t> future;
  {
    py::gil_scoped_release nogil;
    future = lookup ? c->lookup_rows_async(table, r.ids(), r.rows(), min_step)
                    : c->pull_rows_async(table, r.ids(), r.rows(), min_step);
  }
  py::object made = r.new_array;
  return start_async(self.async_calls(), std::move(future), std::move(r.buffers),
                     [made](int64_t&& step) -> py::object {
                       if (made) return made;
                       return py::int_(step);
                     });
}

const char* kPushRowsDoc = R"(Sends gradients for rows of an embedding table.

    client.push_rows('user', ids, grads)   # grads: float32, shape ids.shape + (dim,)

The gradients of a repeated id are summed, then the table's row optimizer
is applied once per id. step: as push's (sync mode: the step the rows were
pulled at). Returns the worst PushStatus over the shards. NaN/Inf or an id
outside a fixed table raises RequestError and applies nothing; wrong dtype,
layout or shape: ValueError, nothing sent.)";

}  // namespace

void bind_tables(py::module_& m) {
  m.def(
      "dedup_ids",
      [](py::object ids) {
        ArrayBuffer in = ArrayBuffer::ids(ids, "dedup_ids: ids");
        const std::span<const int64_t> all = in.id_span();
        if (all.size() >= UINT32_MAX) {  // positions are 32-bit, as a request's
          throw py::value_error("dedup_ids: " + std::to_string(all.size()) +
                                " ids, more than one call takes (2^32 - 2)");
        }
        std::vector<uint64_t> unique;
        py::array_t<int64_t> index(in.shape());
        {
          py::gil_scoped_release nogil;
          // Kept per thread, as ps::dedup_ids_into's: a batch like the one
          // before allocates nothing.
          thread_local ps::FirstPositions seen;
          ps::distinct_keys({reinterpret_cast<const uint64_t*>(all.data()), all.size()}, seen,
                            unique, index.mutable_data());
        }
        py::array out = in.unsigned_ids() ? py::array(py::array_t<uint64_t>(unique.size()))
                                          : py::array(py::array_t<int64_t>(unique.size()));
        if (!unique.empty())
          std::memcpy(out.mutable_data(), unique.data(), unique.size() * sizeof(uint64_t));
        return py::make_tuple(out, index);
      },
      py::arg("ids"),
      R"(A batch's distinct ids and, for each position, the index of its id among them:
what a table pulls once and what a model indexes its rows with.

    unique, index = psclient.dedup_ids(ids)     # ids: int64 or uint64, any shape
    rows = torch.empty(len(unique), dim)
    client.pull_rows("user", unique, rows)
    emb = rows[torch.from_numpy(index)]          # ids.shape + (dim,); autograd sums a repeated
                                                 # id's gradients into its one row

unique keeps the ids' dtype, in order of first appearance; index is int64 of
ids' shape. A hash set, not a sort: several times as fast as np.unique on a
batch.)");

  py::enum_<ps::RowOptimizerKind>(m, "RowOptimizerKind",
                                  "Optimizer psd applies to the rows a push touches.")
      .value("SGD", ps::RowOptimizerKind::kSgd)
      .value("ADAGRAD", ps::RowOptimizerKind::kAdagrad)
      .value("LAZY_ADAM", ps::RowOptimizerKind::kLazyAdam)
      .value("FTRL", ps::RowOptimizerKind::kFtrl);

  py::class_<ps::RowOptimizerConfig>(
      m, "RowOptimizerConfig",
      "A table's row optimizer, applied to the rows a push touches only:\n"
      "RowOptimizerConfig.sgd(lr), .adagrad(lr, initial_accumulator), .lazy_adam(lr, ...),\n"
      ".ftrl(lr, l1, l2, initial_accumulator, lr_power). The default is sgd(0.01).")
      .def(py::init<>())
      .def_readwrite("kind", &ps::RowOptimizerConfig::kind)
      .def_readwrite("learning_rate", &ps::RowOptimizerConfig::learning_rate)
      .def_readwrite("initial_accumulator", &ps::RowOptimizerConfig::initial_accumulator)
      .def_readwrite("beta1", &ps::RowOptimizerConfig::beta1)
      .def_readwrite("beta2", &ps::RowOptimizerConfig::beta2)
      .def_readwrite("epsilon", &ps::RowOptimizerConfig::epsilon)
      .def_readwrite("l1", &ps::RowOptimizerConfig::l1)
      .def_readwrite("l2", &ps::RowOptimizerConfig::l2)
      .def_readwrite("lr_power", &ps::RowOptimizerConfig::lr_power)
      .def_static("sgd", &ps::RowOptimizerConfig::sgd, py::arg("learning_rate"),
                  "Per row: w -= lr * g.")
      .def_static("adagrad", &ps::RowOptimizerConfig::adagrad, py::arg("learning_rate"),
                  py::arg("initial_accumulator") = 0.1f,
                  "Per row: acc += g * g; w -= lr * g / sqrt(acc).")
      .def_static("lazy_adam", &ps::RowOptimizerConfig::lazy_adam, py::arg("learning_rate"),
                  py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f, py::arg("epsilon") = 1e-7f,
                  "Adam on the touched rows only (tf.contrib.opt.LazyAdamOptimizer).")
      .def_static("ftrl", &ps::RowOptimizerConfig::ftrl, py::arg("learning_rate"),
                  py::arg("l1") = 0.0f, py::arg("l2") = 0.0f, py::arg("initial_accumulator") = 0.1f,
                  py::arg("lr_power") = -0.5f, "FTRL-Proximal, as tf.train.FtrlOptimizer.")
      .def("__repr__", [](const ps::RowOptimizerConfig& o) { return repr(o); });

  py::class_<ps::TableSpec>(
      m, "TableSpec",
      R"(What an embedding table is: rows of `dim` floats addressed by 64-bit ids.

    psclient.TableSpec('user', 16, rows=1_000_000,
                       optimizer=psclient.RowOptimizerConfig.adagrad(0.05),
                       init=psclient.uniform(-0.05, 0.05, seed=1))
    psclient.TableSpec('ad', 16, dynamic=True, row_limit=1 << 20, on_limit='evict_lru')
    psclient.TableSpec('query', 16, dynamic=True, min_count=3)
    psclient.TableSpec('item', 16, dynamic=True, expire_after_steps=100_000)

A fixed table has ids in [0, rows), spread 'mod' (id % shards, the
default) or 'div' (contiguous ranges); a dynamic one takes any id (placed by 'hash') and
creates a row on first touch, up to row_limit per shard (0: none), then
refuses new ids or evicts the least recently used rows. With min_count > 1
a dynamic table gives a new id a row only at its min_count-th push: until
then its pulls read its initial values and its gradients are dropped
(counted in TableInfo.ids_filtered); pushes are counted in a count-min
sketch of 4 x count_sketch_width bytes per shard (a power of two; 0:
1 << 22, 16 MiB), which may admit an id early, never late. With
expire_after_steps > 0 a dynamic table drops each row neither pulled nor
pushed in that many global steps (as TrainingSession counts them; counted
in TableInfo.rows_expired).)")
      .def(
          py::init([](std::string name, uint32_t dim, uint64_t rows, bool dynamic,
                      std::optional<std::string> placement, const ps::RowOptimizerConfig& optimizer,
                      const ps::InitConfig& init, uint64_t row_limit, const std::string& on_limit,
                      uint32_t min_count, uint32_t count_sketch_width,
                      uint64_t expire_after_steps) {
            ps::TableSpec s;
            s.name = std::move(name);
            s.dim = dim;
            s.rows = rows;
            s.dynamic = dynamic;
            s.placement = placement ? to_placement(*placement)
                          : dynamic ? ps::TablePlacement::kHash
                                    : ps::TablePlacement::kMod;
            s.optimizer = optimizer;
            s.init = init;
            s.row_limit = row_limit;
            s.on_limit = to_on_limit(on_limit);
            s.min_count = min_count;
            s.count_sketch_width = count_sketch_width;
            s.expire_after_steps = expire_after_steps;
            return s;
          }),
          py::arg("name"), py::arg("dim"), py::kw_only(), py::arg("rows") = 0,
          py::arg("dynamic") = false, py::arg("placement") = py::none(),
          py::arg("optimizer") = ps::RowOptimizerConfig{}, py::arg("init") = ps::InitConfig{},
          py::arg("row_limit") = 0, py::arg("on_limit") = "refuse", py::arg("min_count") = 0,
          py::arg("count_sketch_width") = 0, py::arg("expire_after_steps") = 0)
      .def_readwrite("name", &ps::TableSpec::name)
      .def_readwrite("dim", &ps::TableSpec::dim)
      .def_readwrite("rows", &ps::TableSpec::rows)
      .def_readwrite("dynamic", &ps::TableSpec::dynamic)
      .def_readwrite("optimizer", &ps::TableSpec::optimizer)
      .def_readwrite("init", &ps::TableSpec::init)
      .def_readwrite("min_count", &ps::TableSpec::min_count)
      .def_readwrite("count_sketch_width", &ps::TableSpec::count_sketch_width)
      .def_readwrite("expire_after_steps", &ps::TableSpec::expire_after_steps)
      .def_readwrite("row_limit", &ps::TableSpec::row_limit)
      .def("__repr__", [](const ps::TableSpec& s) {
        return "TableSpec('" + s.name + "', dim=" + std::to_string(s.dim) +
               (s.dynamic ? ", dynamic=True" : ", rows=" + std::to_string(s.rows)) + ", " +
               repr(s.optimizer) + ")";
      });

  py::class_<ps::Client::TableInfo>(m, "TableInfo", "A table as the shards report it.")
      .def_readonly("name", &ps::Client::TableInfo::name)
      .def_readonly("dim", &ps::Client::TableInfo::dim)
      .def_readonly("rows", &ps::Client::TableInfo::rows,
                    "fixed: the table's rows; dynamic: rows held, summed over shards")
      .def_readonly("dynamic", &ps::Client::TableInfo::dynamic)
      .def_readonly("bytes", &ps::Client::TableInfo::bytes, "memory on all shards")
      .def_readonly("evictions", &ps::Client::TableInfo::evictions)
      .def_readonly("ids_filtered", &ps::Client::TableInfo::ids_filtered)
      .def_readonly("rows_expired", &ps::Client::TableInfo::rows_expired)
      .def_readonly("rows_per_shard", &ps::Client::TableInfo::rows_per_shard)
      .def("__repr__", [](const ps::Client::TableInfo& t) {
        return "TableInfo('" + t.name + "', dim=" + std::to_string(t.dim) +
               ", rows=" + std::to_string(t.rows) + ")";
      });

  auto client = py::reinterpret_borrow<py::class_<PyClient>>(m.attr("Client"));
  // pull_rows and lookup_rows, each blocking and as a future: one reader, `lookup` apart.
  for (const auto& [name, lookup, doc] : {std::tuple{"pull_rows", false, kPullRowsDoc},
                                          std::tuple{"lookup_rows", true, kLookupRowsDoc}}) {
    client.def(
        name,
        [lookup](PyClient& self, const std::string& table, py::object ids, py::object out,
                 int64_t min_step) { return read_rows(self, lookup, table, ids, out, min_step); },
        py::arg("table"), py::arg("ids"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("min_step") = 0, doc);
    const std::string async_name = std::string(name) + "_async";
    client.def(
        async_name.c_str(),
        [lookup](PyClient& self, const std::string& table, py::object ids, py::object out,
                 int64_t min_step) {
          return read_rows_async(self, lookup, table, ids, out, min_step);
        },
        py::arg("table"), py::arg("ids"), py::arg("out") = py::none(), py::kw_only(),
        py::arg("min_step") = 0,
        (std::string(name) +
         "() without waiting: a concurrent.futures.Future of its result (the step, or the new "
         "array). Leave ids and out alone until it is done.")
            .c_str());
  }
  client
      .def(
          "create_tables",
          [](PyClient& self, const std::vector<ps::TableSpec>& tables) {
            auto c = self.shared_client();
            {
              py::gil_scoped_release nogil;
              c->create_tables(tables);
            }
            self.remember_tables(tables);
          },
          py::arg("tables"),
          "Creates each table's part on every shard (all shards check all tables first: one "
          "refusal creates nothing). Idempotent for the same specs.")
      .def(
          "declare_tables",
          [](PyClient& self, const std::vector<ps::TableSpec>& tables) {
            self.client().declare_tables(tables);
            self.remember_tables(tables);
          },
          py::arg("tables"), "Knows the tables without creating them (workers that wait).")
      .def(
          "list_tables",
          [](PyClient& self) {
            auto c = self.shared_client();
            py::gil_scoped_release nogil;
            return c->list_tables();
          },
          "The tables as the shards report them (list of TableInfo).")
      .def(
          "push_rows",
          [](PyClient& self, const std::string& table, py::object ids, py::object grads,
             int64_t step) {
            auto c = self.shared_client();
            RowRequest r = gather_rows(self, "push_rows", table, ids, grads, false);
            py::gil_scoped_release nogil;
            return c->push_rows(table, r.ids(), r.rows(), step);
          },
          py::arg("table"), py::arg("ids"), py::arg("grads"), py::kw_only(), py::arg("step") = 0,
          kPushRowsDoc)
      .def(
          "push_rows_async",
          [](PyClient& self, const std::string& table, py::object ids, py::object grads,
             int64_t step) {
            auto c = self.shared_client();
            RowRequest r = gather_rows(self, "push_rows_async", table, ids, grads, false);
            std::future<ps::PushStatus> future;
            {
              py::gil_scoped_release nogil;
              future = c->push_rows_async(table, r.ids(), r.rows(), step);
            }
            return start_async(self.async_calls(), std::move(future), std::move(r.buffers),
                               [](ps::PushStatus&& s) { return py::cast(s); });
          },
          py::arg("table"), py::arg("ids"), py::arg("grads"), py::kw_only(), py::arg("step") = 0,
          "push_rows() without waiting: a concurrent.futures.Future of its PushStatus. Leave ids "
          "and grads unchanged until it is done.");
}

}  // namespace psclient_py
