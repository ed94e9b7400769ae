// psclient.SummaryWriter: TensorBoard event files, without TensorFlow.
#include <memory>
#include <string>

#include "ps/summary_writer.h"
#include "python/src/bindings.h"

namespace psclient_py {

void bind_summary_writer(py::module_& m) {
  py::class_<ps::SummaryWriter>(m, "SummaryWriter",
                                R"(Writes TensorBoard scalars (tensorboard --logdir LOGDIR).

    with psclient.SummaryWriter('runs/job1') as summaries:
        summaries.add_scalar('loss', 0.25, step=100)

Flushed by add_scalar once 64 KiB or 10 s have gathered (there is no timer),
by flush() and when closed or collected.)")
      .def(py::init<std::string>(), py::arg("logdir"),
           "Creates logdir (ConfigError if it cannot) and a new file in it.")
      .def("add_scalar", &ps::SummaryWriter::add_scalar, py::arg("tag"), py::arg("value"),
           py::arg("step"))
      .def("flush", &ps::SummaryWriter::flush, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("path", &ps::SummaryWriter::path, "the event file")
      .def(
          "__enter__", [](ps::SummaryWriter& self) -> ps::SummaryWriter& { return self; },
          py::return_value_policy::reference)
      .def("__exit__", [](ps::SummaryWriter& self, py::args) { self.flush(); });
}

}  // namespace psclient_py
