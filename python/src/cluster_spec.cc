// psclient.ClusterSpec: who is in the job and which task this process is,
// from TensorFlow-style flags, TF_CONFIG or Slurm (ps/cluster_spec.h).
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>

#include "ps/cluster_spec.h"
#include "python/src/bindings.h"

namespace psclient_py {

void bind_cluster_spec(py::module_& m) {
  py::class_<ps::ClusterSpec>(m, "ClusterSpec", R"(Who is in the job and which task this process is.

    spec = psclient.ClusterSpec.from_flags('ps0:2222', 'w0:2222,w1:2222', 'worker', 1)
    spec = psclient.ClusterSpec.from_environment()   # TF_CONFIG, else SLURM_*
    client = psclient.Client(spec.ps_hosts, worker_index=spec.worker_index,
                             is_chief=spec.is_chief)

Bad input raises ConfigError.)")
      .def_static("from_flags", &ps::ClusterSpec::from_flags, py::arg("ps_hosts"),
                  py::arg("worker_hosts"), py::arg("job_name"), py::arg("task_index"),
                  "Comma-separated host lists as --ps_hosts / --worker_hosts; job_name 'ps', "
                  "'worker' or 'chief'.")
      .def_static("from_tf_config", &ps::ClusterSpec::from_tf_config, py::arg("json"),
                  "TF_CONFIG's JSON as TensorFlow and Kubeflow set it.")
      .def_static("from_slurm", &ps::ClusterSpec::from_slurm, py::arg("env"), py::arg("num_ps") = 1,
                  py::arg("port_base") = 2222,
                  "Slurm's SLURM_* variables (a dict): tasks 0..num_ps-1 are ps, the rest workers; "
                  "task t listens "
                  "on port_base + its local rank.")
      .def_static(
          "from_environment",
          [](std::optional<std::map<std::string, std::string>> env, int num_ps, int port_base) {
            return env ? ps::ClusterSpec::from_environment(*env, num_ps, port_base)
                       : ps::ClusterSpec::from_environment(num_ps, port_base);
          },
          py::arg("env") = py::none(), py::arg("num_ps") = 1, py::arg("port_base") = 2222,
          "TF_CONFIG if set, else Slurm if SLURM_PROCID is set, else ConfigError. env: a dict "
          "(default: this "
          "process's environment at the C level).")
      .def_property_readonly("ps_hosts", &ps::ClusterSpec::ps_hosts)
      .def_property_readonly("worker_hosts", &ps::ClusterSpec::worker_hosts,
                             "every training worker, chief first")
      .def_property_readonly("evaluator_hosts", &ps::ClusterSpec::evaluator_hosts)
      .def_property_readonly("job_name", &ps::ClusterSpec::job_name)
      .def_property_readonly("task_index", &ps::ClusterSpec::task_index)
      .def_property_readonly("is_ps", &ps::ClusterSpec::is_ps)
      .def_property_readonly("is_worker", &ps::ClusterSpec::is_worker)
      .def_property_readonly("is_evaluator", &ps::ClusterSpec::is_evaluator)
      .def_property_readonly("is_chief", &ps::ClusterSpec::is_chief)
      .def_property_readonly("num_ps", &ps::ClusterSpec::num_ps)
      .def_property_readonly("num_workers", &ps::ClusterSpec::num_workers)
      .def_property_readonly("worker_index", &ps::ClusterSpec::worker_index,
                             "index in worker_hosts; -1 for ps")
      .def_property_readonly("local_gpu", &ps::ClusterSpec::local_gpu)
      .def_property_readonly("self_address", &ps::ClusterSpec::self_address)
      .def("__eq__", [](const ps::ClusterSpec& a, const ps::ClusterSpec& b) { return a == b; })
      .def("__repr__",
           [](const ps::ClusterSpec& s) { return "ClusterSpec(" + s.to_string() + ")"; })
      .def("__str__", &ps::ClusterSpec::to_string);
}

}  // namespace psclient_py
