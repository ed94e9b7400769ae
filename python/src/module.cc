// psclient's extension module: libpsclient's API for Python. The package
// (python/psclient/__init__.py) re-exports it; users import psclient.
#include "python/src/bindings.h"

PYBIND11_MODULE(_psclient, m) {
  m.doc() =
      "libpsclient, the client of the psd parameter server (import psclient, not this module)";
  psclient_py::bind_errors(m);
  psclient_py::bind_tensor_spec(m);
  psclient_py::bind_client(m);
  psclient_py::bind_tables(m);
  psclient_py::bind_training_session(m);
  psclient_py::bind_cluster_spec(m);
  psclient_py::bind_summary_writer(m);
  psclient_py::bind_ctr_data(m);
  psclient_py::bind_checkpoint(m);
}
