#include "python/src/errors.h"

#include <new>
#include <stdexcept>
#include <string>

#include "ps/checkpoint.h"
#include "ps/errors.h"
#include "python/src/bindings.h"

namespace psclient_py {
namespace {

// Owned by the module (added to it), alive while it is loaded.
PyObject* error_type = nullptr;
PyObject* connection_error_type = nullptr;
PyObject* request_error_type = nullptr;
PyObject* config_error_type = nullptr;
PyObject* checkpoint_error_type = nullptr;

PyObject* new_exception(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("psclient.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

// The Python type and message for a C++ exception; nullptr type for one
// pybind11 translates itself.
PyObject* type_of(std::exception_ptr error, std::string* message) {
  try {
    std::rethrow_exception(error);
  } catch (const ps::InterruptedError& e) {
    *message = e.what();
    return PyExc_KeyboardInterrupt;
  } catch (const ps::ConnectionError& e) {
    *message = e.what();
    return connection_error_type;
  } catch (const ps::RequestError& e) {
    *message = e.what();
    return request_error_type;
  } catch (const ps::ConfigError& e) {
    *message = e.what();
    return config_error_type;
  } catch (const ps::CheckpointError& e) {
    *message = e.what();
    return checkpoint_error_type;
  } catch (const ps::Error& e) {
    *message = e.what();
    return error_type;
  } catch (const std::invalid_argument& e) {
    *message = e.what();
    return PyExc_ValueError;
  } catch (const std::bad_alloc&) {
    *message = "out of memory";
    return PyExc_MemoryError;
  } catch (const std::exception& e) {
    *message = e.what();
    return PyExc_RuntimeError;
  } catch (...) {
    *message = "unknown C++ exception";
    return PyExc_RuntimeError;
  }
}

}  // namespace

py::object exception_object(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const py::error_already_set& e) {
    return e.value();
  } catch (...) {
  }
  std::string message;
  PyObject* type = type_of(error, &message);
  return py::reinterpret_borrow<py::object>(type)(message);
}

void bind_errors(py::module_& m) {
  error_type = new_exception(m, "Error", "Base of every error libpsclient raises on purpose.",
                             py::make_tuple(py::handle(PyExc_RuntimeError)));
  py::handle base(error_type);
  connection_error_type = new_exception(
      m, "ConnectionError",
      "A shard could not be reached, or the connection broke (also a builtins.ConnectionError).",
      py::make_tuple(base, py::handle(PyExc_ConnectionError)));
  request_error_type = new_exception(m, "RequestError",
                                     "A shard refused a request (unknown tensor, wrong shape, NaN "
                                     "gradient, ...); its state is unchanged.",
                                     py::make_tuple(base));
  config_error_type =
      new_exception(m, "ConfigError", "Bad configuration: flags, TF_CONFIG, SLURM_* or data files.",
                    py::make_tuple(base));
  checkpoint_error_type = new_exception(
      m, "CheckpointError",
      "No complete checkpoint, or a checkpoint file that is not valid (load_checkpoint).",
      py::make_tuple(base));
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const ps::InterruptedError& e) {
      // The signal handler's own exception (KeyboardInterrupt) is already set.
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    } catch (const ps::Error&) {
      std::string message;
      PyObject* type = type_of(error, &message);
      PyErr_SetString(type, message.c_str());
    }
  });
}

}  // namespace psclient_py
