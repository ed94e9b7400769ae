// TensorSpec, OptimizerConfig and InitConfig, and the helpers that make them
// (psclient.sgd(0.1), psclient.glorot_uniform(42), ...): the C++ value types
// with the same names and defaults (SGD 0.01, zeros).
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ps/tensor_spec.h"
#include "python/src/bindings.h"
#include "python/src/array_buffer.h"

namespace psclient_py {
namespace {

std::vector<uint64_t> to_shape(py::handle shape) {
  if (py::isinstance<py::int_>(shape)) {
    const auto n = shape.cast<int64_t>();
    if (n < 0) throw py::value_error("shape: dimensions must be >= 0, got " + std::to_string(n));
    return {static_cast<uint64_t>(n)};
  }
  std::vector<uint64_t> out;
  for (py::handle d : py::iter(shape)) {
    const auto n = py::int_(py::reinterpret_borrow<py::object>(d)).cast<int64_t>();
    if (n < 0) throw py::value_error("shape: dimensions must be >= 0, got " + std::to_string(n));
    out.push_back(static_cast<uint64_t>(n));
  }
  return out;
}

std::string repr(const ps::OptimizerConfig& o) {
  static const char* names[] = {"sgd", "momentum", "adam", "adagrad", "rmsprop"};
  return std::string("OptimizerConfig(") + names[static_cast<int>(o.kind)] +
         ", learning_rate=" + std::to_string(o.learning_rate) + ")";
}

std::string repr(const ps::InitConfig& i) {
  static const char* names[] = {
      "zeros",          "constant",      "uniform", "normal", "truncated_normal",
      "glorot_uniform", "glorot_normal", "values"};
  return std::string("InitConfig(") + names[static_cast<int>(i.kind)] + ")";
}

}  // namespace

void bind_tensor_spec(py::module_& m) {
  py::enum_<ps::OptimizerKind>(m, "OptimizerKind", "Optimizer psd applies to a tensor's gradients.")
      .value("SGD", ps::OptimizerKind::kSgd)
      .value("MOMENTUM", ps::OptimizerKind::kMomentum)
      .value("ADAM", ps::OptimizerKind::kAdam)
      .value("ADAGRAD", ps::OptimizerKind::kAdagrad)
      .value("RMSPROP", ps::OptimizerKind::kRmsProp);
  py::enum_<ps::LrSchedule>(m, "LrSchedule",
                            "How the learning rate changes with the global step (applied on psd).")
      .value("CONSTANT", ps::LrSchedule::kConstant)
      .value("EXPONENTIAL_DECAY", ps::LrSchedule::kExponentialDecay)
      .value("PIECEWISE", ps::LrSchedule::kPiecewise)
      .value("COSINE_DECAY", ps::LrSchedule::kCosineDecay);
  py::enum_<ps::InitKind>(m, "InitKind", "How psd fills a tensor it creates.")
      .value("ZEROS", ps::InitKind::kZeros)
      .value("CONSTANT", ps::InitKind::kConstant)
      .value("UNIFORM", ps::InitKind::kUniform)
      .value("NORMAL", ps::InitKind::kNormal)
      .value("TRUNCATED_NORMAL", ps::InitKind::kTruncatedNormal)
      .value("GLOROT_UNIFORM", ps::InitKind::kGlorotUniform)
      .value("GLOROT_NORMAL", ps::InitKind::kGlorotNormal)
      .value("VALUES", ps::InitKind::kValues);

  py::class_<ps::OptimizerConfig>(
      m, "OptimizerConfig",
      "An optimizer and its hyper-parameters; make one with psclient.sgd(), adam(), ...\n"
      "Fields may be changed before the tensor is created (e.g. a learning-rate schedule).")
      .def(py::init<>())
      .def_readwrite("kind", &ps::OptimizerConfig::kind)
      .def_readwrite("learning_rate", &ps::OptimizerConfig::learning_rate)
      .def_readwrite("momentum", &ps::OptimizerConfig::momentum)
      .def_readwrite("nesterov", &ps::OptimizerConfig::nesterov)
      .def_readwrite("beta1", &ps::OptimizerConfig::beta1)
      .def_readwrite("beta2", &ps::OptimizerConfig::beta2)
      .def_readwrite("epsilon", &ps::OptimizerConfig::epsilon)
      .def_readwrite("initial_accumulator", &ps::OptimizerConfig::initial_accumulator)
      .def_readwrite("decay", &ps::OptimizerConfig::decay)
      .def_readwrite("schedule", &ps::OptimizerConfig::schedule)
      .def_readwrite("decay_rate", &ps::OptimizerConfig::decay_rate)
      .def_readwrite("decay_steps", &ps::OptimizerConfig::decay_steps)
      .def_readwrite("alpha", &ps::OptimizerConfig::alpha)
      .def_readwrite("staircase", &ps::OptimizerConfig::staircase)
      .def_readwrite("boundaries", &ps::OptimizerConfig::boundaries)
      .def("learning_rate_at", &ps::OptimizerConfig::learning_rate_at, py::arg("global_step"),
           "The learning rate in effect at global_step.")
      .def("__repr__", [](const ps::OptimizerConfig& o) { return repr(o); });

  m.def("sgd", &ps::OptimizerConfig::sgd, py::arg("learning_rate"), "Plain SGD: w -= lr * g.");
  m.def("momentum", &ps::OptimizerConfig::with_momentum, py::arg("learning_rate"),
        py::arg("momentum") = 0.9f, py::arg("nesterov") = false,
        "SGD with momentum (Nesterov's with nesterov=True).");
  m.def("adam", &ps::OptimizerConfig::adam, py::arg("learning_rate"), py::arg("beta1") = 0.9f,
        py::arg("beta2") = 0.999f, py::arg("epsilon") = 1e-7f, "Adam, as tf.train.AdamOptimizer.");
  m.def("adagrad", &ps::OptimizerConfig::adagrad, py::arg("learning_rate"),
        py::arg("initial_accumulator") = 0.1f, "Adagrad, as tf.train.AdagradOptimizer.");
  m.def("rmsprop", &ps::OptimizerConfig::rmsprop, py::arg("learning_rate"), py::arg("decay") = 0.9f,
        py::arg("momentum") = 0.0f, py::arg("epsilon") = 1e-7f,
        "RMSProp, as tf.train.RMSPropOptimizer.");
  m.def("optimizer", &ps::OptimizerConfig::from_name, py::arg("name"), py::arg("learning_rate"),
        "An optimizer by name: 'sgd', 'momentum', 'nesterov', 'adam', 'adagrad' or 'rmsprop' (else "
        "ConfigError).");

  py::class_<ps::InitConfig>(
      m, "InitConfig",
      "A tensor's initializer; make one with psclient.zeros(), glorot_uniform(), ...")
      .def(py::init<>())
      .def_readwrite("kind", &ps::InitConfig::kind)
      .def_readwrite("a", &ps::InitConfig::a, "constant value; uniform low; normal mean")
      .def_readwrite("b", &ps::InitConfig::b, "uniform high; normal stddev")
      .def_readwrite("seed", &ps::InitConfig::seed)
      .def_readwrite("values", &ps::InitConfig::values)
      .def("__repr__", [](const ps::InitConfig& i) { return repr(i); });

  m.def("zeros", &ps::InitConfig::zeros, "All zeros (the default).");
  m.def("constant", &ps::InitConfig::constant, py::arg("value"), "Every element `value`.");
  m.def("uniform", &ps::InitConfig::uniform, py::arg("low"), py::arg("high"), py::arg("seed") = 0,
        "Uniform in [low, high).");
  m.def("normal", &ps::InitConfig::normal, py::arg("mean"), py::arg("stddev"), py::arg("seed") = 0,
        "Normal(mean, stddev).");
  m.def("truncated_normal", &ps::InitConfig::truncated_normal, py::arg("mean"), py::arg("stddev"),
        py::arg("seed") = 0, "Normal(mean, stddev), redrawn beyond two stddevs.");
  m.def(
      "glorot_uniform", &ps::InitConfig::glorot_uniform, py::arg("seed") = 0,
      "Glorot (Xavier) uniform: the last dimension is fan-out, the product of the others fan-in.");
  m.def("glorot_normal", &ps::InitConfig::glorot_normal, py::arg("seed") = 0,
        "Glorot (Xavier) normal.");
  m.def(
      "from_values",
      [](py::object values) {
        ArrayBuffer b = ArrayBuffer::floats(values, false, "from_values: values");
        return ps::InitConfig::from_values(std::vector<float>(b.span().begin(), b.span().end()));
      },
      py::arg("values"), "Exactly these values (a float32 array of the tensor's element count).");

  py::class_<ps::TensorSpec>(
      m, "TensorSpec",
      "What a tensor is: name, shape, optimizer and initializer.\n\n"
      "    psclient.TensorSpec('w', (784, 100), optimizer=psclient.adam(1e-3),\n"
      "                        init=psclient.glorot_uniform(42))")
      .def(py::init([](std::string name, py::object shape, const ps::OptimizerConfig& optimizer,
                       const ps::InitConfig& init, bool trainable) {
             ps::TensorSpec s;
             s.name = std::move(name);
             s.shape = to_shape(shape);
             s.optimizer = optimizer;
             s.init = init;
             s.trainable = trainable;
             return s;
           }),
           py::arg("name"), py::arg("shape"), py::kw_only(),
           py::arg("optimizer") = ps::OptimizerConfig{}, py::arg("init") = ps::InitConfig{},
           py::arg("trainable") = true)
      .def_readwrite("name", &ps::TensorSpec::name)
      .def_property(
          "shape", [](const ps::TensorSpec& s) { return py::tuple(py::cast(s.shape)); },
          [](ps::TensorSpec& s, py::object shape) { s.shape = to_shape(shape); })
      .def_readwrite("optimizer", &ps::TensorSpec::optimizer)
      .def_readwrite("init", &ps::TensorSpec::init)
      .def_readwrite("trainable", &ps::TensorSpec::trainable)
      .def_property_readonly("num_elements", &ps::TensorSpec::num_elements)
      .def("__repr__", [](const ps::TensorSpec& s) {
        return "TensorSpec('" + s.name + "', " + ps::shape_to_string(s.shape) + ", " +
               repr(s.optimizer) + ", " + repr(s.init) + ")";
      });
}

}  // namespace psclient_py
