// Reading psd checkpoints from Python (include/ps/checkpoint.h's
// load_checkpoint): a model's tensors and tables as NumPy arrays, for
// serving, export and inspection without a running psd. The arrays own the
// vectors load_checkpoint filled (no copy of a large table).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/checkpoint.h"
#include "python/src/bindings.h"

namespace psclient_py {
namespace {

// A NumPy array of `shape` over the data of `v`, which it takes and frees.
template <typename T>
py::array_t<T> owning_array(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* held = new std::vector<T>(std::move(v));
  py::capsule free_when_done(held, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), held->data(), free_when_done);
}

struct PyRestoredTable {
  ps::TableSpec spec;
  uint64_t version = 0;
  py::object ids, values, slots;
};

struct PyRestoredModel {
  int64_t global_step = 0;
  uint32_t num_shards = 0;
  std::vector<std::string> files;
  py::object job = py::none();
  py::dict tensors, tensor_slots, tables;
};

PyRestoredModel load(const std::string& dir) {
  ps::RestoredModel m;
  {
    py::gil_scoped_release nogil;
    m = ps::load_checkpoint(dir);
  }
  PyRestoredModel out;
  out.global_step = m.global_step;
  out.num_shards = m.num_shards;
  out.files = m.files;
  if (m.job_configured) out.job = py::cast(m.job);
  for (ps::TensorSpec& t : m.tensors) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::list slots;
    for (auto& s : t.slots) slots.append(owning_array(std::move(s), shape));
    out.tensor_slots[py::str(t.name)] = slots;
    out.tensors[py::str(t.name)] = owning_array(std::move(t.init.values), std::move(shape));
  }
  for (ps::RestoredTable& t : m.tables) {
    const auto rows = static_cast<py::ssize_t>(t.ids.size());
    const auto dim = static_cast<py::ssize_t>(t.spec.dim);
    PyRestoredTable r;
    r.spec = t.spec;
    r.version = t.version;
    r.ids = owning_array(std::move(t.ids), {rows});
    r.values = owning_array(std::move(t.values), {rows, dim});
    py::list slots;
    for (auto& s : t.slots) slots.append(owning_array(std::move(s), {rows, dim}));
    r.slots = slots;
    out.tables[py::str(t.spec.name)] = py::cast(std::move(r));
  }
  return out;
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  py::class_<PyRestoredTable>(m, "RestoredTable",
                              "An embedding table's rows from every shard of a checkpoint (a "
                              "dynamic table: the rows that existed).")
      .def_readonly("spec", &PyRestoredTable::spec)
      .def_readonly("version", &PyRestoredTable::version, "the most updates any shard had applied")
      .def_readonly("ids", &PyRestoredTable::ids, "int64 array of the rows' ids")
      .def_readonly("values", &PyRestoredTable::values,
                    "float32 array (len(ids), dim): row i is ids[i]'s")
      .def_readonly("slots", &PyRestoredTable::slots,
                    "the row optimizer's slots, each laid out as values (Adagrad: accumulator)");
  py::class_<PyRestoredModel>(m, "RestoredModel", "A model as load_checkpoint read it.")
      .def_readonly("global_step", &PyRestoredModel::global_step,
                    "the step the checkpoint was taken at")
      .def_readonly("num_shards", &PyRestoredModel::num_shards, "how many shards wrote it")
      .def_readonly("files", &PyRestoredModel::files, "the files read, shard by shard")
      .def_readonly("job", &PyRestoredModel::job,
                    "the JobConfig saved with it, or None where no job was configured")
      .def_readonly("tensors", &PyRestoredModel::tensors,
                    "name -> float32 array of the tensor's values, in its shape")
      .def_readonly("tensor_slots", &PyRestoredModel::tensor_slots,
                    "name -> list of the optimizer's slot arrays (Adam: m, v), each in the shape")
      .def_readonly("tables", &PyRestoredModel::tables, "name -> RestoredTable");
  m.def("load_checkpoint", &load, py::arg("dir"),
        R"(Reads the newest complete checkpoint under `dir` (psd --checkpoint_dir).

    m = psclient.load_checkpoint("/ckpt")
    w = m.tensors["layer1/weights"]          # float32, the tensor's shape
    emb = m.tables["user"]                   # .ids (int64), .values (len(ids), dim)
    row_of = dict(zip(emb.ids.tolist(), emb.values))   # a serving lookup

Every shard's files of the newest step they all have are read and put
together, whatever the number of shards; a file that is not valid is logged
and older steps tried. No psd needs to run. The GIL is released while
reading. Raises psclient.CheckpointError when there is no complete
checkpoint.)");
}

}  // namespace psclient_py
