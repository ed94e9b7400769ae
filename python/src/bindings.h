// The parts of the _psclient extension module, one concept per file; module.cc
// calls them in this order (later parts use the types earlier ones define).
#pragma once

#include <pybind11/pybind11.h>

namespace psclient_py {

namespace py = pybind11;

void bind_errors(py::module_& m);  // errors.cc: psclient.Error and its subclasses
void bind_tensor_spec(
    py::module_& m);               // tensor_spec.cc: TensorSpec, optimizer and initializer helpers
void bind_client(py::module_& m);  // client.cc: Client, PullResult, PushResult, futures
void bind_tables(py::module_& m);  // tables.cc: TableSpec, RowOptimizerConfig, Client.pull_rows ...
void bind_training_session(py::module_& m);  // training_session.cc: TrainingSession
void bind_cluster_spec(py::module_& m);      // cluster_spec.cc: ClusterSpec
void bind_summary_writer(py::module_& m);    // summary_writer.cc: SummaryWriter
void bind_ctr_data(py::module_& m);  // ctr_data.cc: read_ctr, ctr_synthetic, roc_auc, log_loss
void bind_checkpoint(py::module_& m);  // checkpoint.cc: load_checkpoint, RestoredModel

}  // namespace psclient_py
