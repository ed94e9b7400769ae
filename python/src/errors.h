// libpsclient's exceptions as Python exceptions: psclient.Error (a
// RuntimeError) with ConnectionError (also a builtins.ConnectionError),
// RequestError and ConfigError under it, each carrying the C++ message.
#pragma once

#include <exception>

#include <pybind11/pybind11.h>

namespace psclient_py {

namespace py = pybind11;

// The Python exception instance for a C++ exception (what the translator
// would raise), for futures that carry it instead of raising. GIL held.
py::object exception_object(std::exception_ptr error);

}  // namespace psclient_py
