// The huddle_client Python module: the client SDK (huddle/client/client.h, trainer.h) for a
// trainer written in Python. README.md beside this file is its user guide; the contracts are in
// py_trainer.h (calls into Python), tensors.h (tensors across the boundary) and run.h (the GIL,
// Ctrl-C).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>
#include <string>

#include "client/python/py_trainer.h"
#include "client/python/run.h"
#include "client/python/tensors.h"
#include "huddle/client/client.h"
#include "huddle/client/trainer.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace huddle::client::python {
namespace {

// "(16, 1, 5, 5)"-style shapes: tuples, comparable with numpy's and torch's .shape.
py::tuple ShapeTuple(const std::vector<int64_t>& shape) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = py::int_(shape[i]);
  return t;
}

std::vector<int64_t> ShapeFrom(py::handle obj) {
  std::vector<int64_t> shape;
  for (py::handle d : obj) shape.push_back(d.cast<int64_t>());
  return shape;
}

// A path argument: str or os.PathLike.
std::string PathFrom(py::handle obj) {
  return py::str(py::module_::import("os").attr("fspath")(obj));
}

std::string Quote(const std::string& s) { return py::repr(py::str(s)); }

template <typename T>
std::string Optional(const std::optional<T>& v) {
  return v ? std::string(py::repr(py::cast(*v))) : "None";
}

[[noreturn]] void RaiseNotImplemented(const std::string& what) {
  PyErr_SetString(PyExc_NotImplementedError, what.c_str());
  throw py::error_already_set();
}

void BindTypes(py::module_& m) {
  py::class_<TensorInfo>(m, "TensorInfo", "The name and shape of one of the model's tensors.")
      .def(py::init([](std::string name, py::handle shape) {
             return TensorInfo{std::move(name), ShapeFrom(shape)};
           }),
           "name"_a, "shape"_a)
      .def_readwrite("name", &TensorInfo::name)
      .def_property(
          "shape", [](const TensorInfo& t) { return ShapeTuple(t.shape); },
          [](TensorInfo& t, py::handle shape) { t.shape = ShapeFrom(shape); },
          "A tuple of ints, like numpy's and torch's .shape.")
      .def("__eq__", [](const TensorInfo& a,
                        const TensorInfo& b) { return a.name == b.name && a.shape == b.shape; })
      .def("__repr__", [](const TensorInfo& t) {
        return "TensorInfo(" + Quote(t.name) + ", " + ShapeString(t.shape) + ")";
      });

  py::class_<JobInfo>(m, "JobInfo", "The job a client joined (given to Trainer.start).")
      .def(py::init([](std::string name, std::vector<TensorInfo> tensors, std::string kind) {
             return JobInfo{std::move(name), std::move(tensors), std::move(kind)};
           }),
           py::kw_only(), "name"_a = "", "tensors"_a = std::vector<TensorInfo>{},
           "model_kind"_a = "")
      .def_readwrite("name", &JobInfo::name)
      .def_readwrite("tensors", &JobInfo::tensors,
                     "The model's tensors (TensorInfo), in the order fit and evaluate get the "
                     "weights and fit must return them.")
      .def_readwrite("model_kind", &JobInfo::model_kind,
                     "'layers' or 'mlp' (a model of Huddle's layer set), or 'external'.")
      .def("__repr__", [](const JobInfo& j) {
        return "JobInfo(name=" + Quote(j.name) + ", model_kind=" + Quote(j.model_kind) + ", " +
               std::to_string(j.tensors.size()) + " tensors)";
      });

  py::class_<DpSgdConfig>(m, "DpSgdConfig",
                          "Example-level DP-SGD that a round asks the trainer to run.")
      .def(py::init([](double z, double c, int64_t b, double delta) {
             return DpSgdConfig{z, c, b, delta};
           }),
           py::kw_only(), "noise_multiplier"_a = 0.0, "clip_norm"_a = 0.0,
           "expected_batch_size"_a = 0, "delta"_a = 0.0)
      .def_readwrite("noise_multiplier", &DpSgdConfig::noise_multiplier)
      .def_readwrite("clip_norm", &DpSgdConfig::clip_norm)
      .def_readwrite("expected_batch_size", &DpSgdConfig::expected_batch_size)
      .def_readwrite("delta", &DpSgdConfig::delta)
      .def("__repr__", [](const DpSgdConfig& c) {
        std::ostringstream s;
        s << "DpSgdConfig(noise_multiplier=" << c.noise_multiplier << ", clip_norm=" << c.clip_norm
          << ", expected_batch_size=" << c.expected_batch_size << ", delta=" << c.delta << ")";
        return s.str();
      });

  py::class_<FitConfig>(m, "FitConfig", "One round's training settings (the job's `train:`).")
      .def(py::init([](uint64_t round, uint64_t seed, int64_t epochs, int64_t batch_size,
                       double learning_rate, double momentum, double weight_decay,
                       std::optional<DpSgdConfig> dp_sgd) {
             return FitConfig{round,         seed,     epochs,       batch_size,
                              learning_rate, momentum, weight_decay, dp_sgd};
           }),
           py::kw_only(), "round"_a = 0, "seed"_a = 0, "epochs"_a = 1, "batch_size"_a = 32,
           "learning_rate"_a = 0.1, "momentum"_a = 0.0, "weight_decay"_a = 0.0,
           "dp_sgd"_a = py::none())
      .def_readwrite("round", &FitConfig::round)
      .def_readwrite("seed", &FitConfig::seed,
                     "This client's seed for the round (shuffling, dropout): reproducible runs.")
      .def_readwrite("epochs", &FitConfig::epochs)
      .def_readwrite("batch_size", &FitConfig::batch_size)
      .def_readwrite("learning_rate", &FitConfig::learning_rate)
      .def_readwrite("momentum", &FitConfig::momentum)
      .def_readwrite("weight_decay", &FitConfig::weight_decay)
      .def_readwrite("dp_sgd", &FitConfig::dp_sgd,
                     "A DpSgdConfig when the round must train with DP-SGD (then FitResult.dp_sgd "
                     "is required), else None.")
      .def("__repr__", [](const FitConfig& c) {
        std::ostringstream s;
        s << "FitConfig(round=" << c.round << ", seed=" << c.seed << ", epochs=" << c.epochs
          << ", batch_size=" << c.batch_size << ", learning_rate=" << c.learning_rate
          << ", momentum=" << c.momentum << ", weight_decay=" << c.weight_decay
          << ", dp_sgd=" << Optional(c.dp_sgd) << ")";
        return s.str();
      });

  py::class_<DpSgdReport>(m, "DpSgdReport", "What a DP-SGD fit spent (FitResult.dp_sgd).")
      .def(py::init([](double z, double q, int64_t steps) {
             return DpSgdReport{z, q, steps};
           }),
           py::kw_only(), "noise_multiplier"_a = 0.0, "sampling_rate"_a = 0.0, "steps"_a = 0)
      .def_readwrite("noise_multiplier", &DpSgdReport::noise_multiplier)
      .def_readwrite("sampling_rate", &DpSgdReport::sampling_rate)
      .def_readwrite("steps", &DpSgdReport::steps)
      .def("__repr__", [](const DpSgdReport& r) {
        std::ostringstream s;
        s << "DpSgdReport(noise_multiplier=" << r.noise_multiplier
          << ", sampling_rate=" << r.sampling_rate << ", steps=" << r.steps << ")";
        return s.str();
      });

  py::class_<PyFitResult>(m, "FitResult", "What Trainer.fit returns.")
      .def(py::init([](py::object tensors, bool is_delta, int64_t num_examples,
                       std::map<std::string, double> metrics, std::optional<DpSgdReport> dp_sgd) {
             return PyFitResult{std::move(tensors), is_delta, num_examples, std::move(metrics),
                                dp_sgd};
           }),
           py::kw_only(), "tensors"_a = py::list(), "is_delta"_a = false, "num_examples"_a = 0,
           "metrics"_a = std::map<std::string, double>{}, "dp_sgd"_a = py::none())
      .def_readwrite("tensors", &PyFitResult::tensors,
                     "The model's tensors after training (or local - global when is_delta): a "
                     "list in JobInfo.tensors order, or a dict name -> tensor; each a float array "
                     "of the tensor's shape (numpy, a CPU torch tensor without grad, anything "
                     "with the buffer protocol).")
      .def_readwrite("is_delta", &PyFitResult::is_delta)
      .def_readwrite("num_examples", &PyFitResult::num_examples,
                     "The examples trained on (the average's weight); 0: Trainer.num_examples().")
      .def_readwrite("metrics", &PyFitResult::metrics,
                     "Training metrics; 'loss' and 'accuracy' are the job's train_loss and "
                     "train_accuracy.")
      .def_readwrite("dp_sgd", &PyFitResult::dp_sgd)
      .def("__repr__", [](const PyFitResult& r) {
        return "FitResult(" + std::to_string(py::len(r.tensors)) +
               " tensors, is_delta=" + (r.is_delta ? "True" : "False") +
               ", num_examples=" + std::to_string(r.num_examples) +
               ", metrics=" + std::string(py::repr(py::cast(r.metrics))) +
               ", dp_sgd=" + Optional(r.dp_sgd) + ")";
      });

  py::class_<EvaluateResult>(m, "EvaluateResult", "What Trainer.evaluate returns.")
      .def(py::init([](int64_t n, double loss, double accuracy) {
             return EvaluateResult{n, loss, accuracy};
           }),
           py::kw_only(), "num_examples"_a = 0, "loss"_a = 0.0, "accuracy"_a = 0.0)
      .def_readwrite("num_examples", &EvaluateResult::num_examples)
      .def_readwrite("loss", &EvaluateResult::loss)
      .def_readwrite("accuracy", &EvaluateResult::accuracy)
      .def("__repr__", [](const EvaluateResult& r) {
        std::ostringstream s;
        s << "EvaluateResult(num_examples=" << r.num_examples << ", loss=" << r.loss
          << ", accuracy=" << r.accuracy << ")";
        return s.str();
      });

  py::class_<ClientOptions>(m, "ClientOptions",
                            "How the client connects (huddle/client/client.h, ClientOptions).")
      .def(py::init([](py::object config_file, std::string coordinator, std::string client_id,
                       py::object secret_key_file, py::object server_key_file,
                       py::object project_key_file, bool insecure, py::object privacy_ledger,
                       double give_up_after_s, std::string log_level) {
             ClientOptions o;
             auto path = [](const py::object& p) { return p.is_none() ? "" : PathFrom(p); };
             o.config_file = path(config_file);
             o.coordinator = std::move(coordinator);
             o.client_id = std::move(client_id);
             o.secret_key_file = path(secret_key_file);
             o.server_key_file = path(server_key_file);
             o.project_key_file = path(project_key_file);
             o.insecure = insecure;
             o.privacy_ledger = path(privacy_ledger);
             o.give_up_after_s = give_up_after_s;
             o.log_level = std::move(log_level);
             return o;
           }),
           py::kw_only(), "config_file"_a = py::none(), "coordinator"_a = "", "client_id"_a = "",
           "secret_key_file"_a = py::none(), "server_key_file"_a = py::none(),
           "project_key_file"_a = py::none(), "insecure"_a = false, "privacy_ledger"_a = py::none(),
           "give_up_after_s"_a = 0.0, "log_level"_a = "")
      .def_readwrite("config_file", &ClientOptions::config_file)
      .def_readwrite("coordinator", &ClientOptions::coordinator)
      .def_readwrite("client_id", &ClientOptions::client_id)
      .def_readwrite("secret_key_file", &ClientOptions::secret_key_file)
      .def_readwrite("server_key_file", &ClientOptions::server_key_file)
      .def_readwrite("project_key_file", &ClientOptions::project_key_file)
      .def_readwrite("insecure", &ClientOptions::insecure)
      .def_readwrite("privacy_ledger", &ClientOptions::privacy_ledger)
      .def_readwrite("give_up_after_s", &ClientOptions::give_up_after_s)
      .def_readwrite("log_level", &ClientOptions::log_level)
      .def("__repr__", [](const ClientOptions& o) {
        std::ostringstream s;
        s << "ClientOptions(coordinator=" << Quote(o.coordinator)
          << ", client_id=" << Quote(o.client_id)
          << ", insecure=" << (o.insecure ? "True" : "False") << ")";
        return s.str();
      });
}

void BindTrainer(py::module_& m) {
  py::class_<Trainer, PyTrainer>(m, "Trainer", R"(Base class of a Python trainer.

Subclass it, call super().__init__(), and define:
  num_examples(self) -> int                     required
  start(self, job: JobInfo) -> None             optional; raise to refuse the job
  fit(self, weights: list[numpy.ndarray], config: FitConfig) -> FitResult    required
  evaluate(self, weights: list[numpy.ndarray]) -> EvaluateResult           optional
  can_evaluate(self) -> bool                    optional; default: whether evaluate is defined

weights are float32 copies of the round's model in JobInfo.tensors order, owned by the caller.
The client SDK calls these methods from its worker thread, one at a time; an exception raised in
fit or evaluate fails that round for this client (its type and message are logged and sent to
the coordinator), one raised in start refuses the job.)")
      .def(py::init<>())
      .def("num_examples",
           [](const Trainer&) -> int64_t {
             RaiseNotImplemented("Trainer.num_examples must be defined by the subclass");
           })
      .def(
          "start", [](Trainer&, const JobInfo&) {}, "job"_a)
      .def(
          "fit",
          [](Trainer&, py::handle, const FitConfig&) -> py::object {
            RaiseNotImplemented("Trainer.fit must be defined by the subclass");
          },
          "weights"_a, "config"_a)
      .def("can_evaluate",
           [](const Trainer& t) {
             const auto* p = dynamic_cast<const PyTrainer*>(&t);
             return p != nullptr && p->Overrides("evaluate");
           })
      .def(
          "evaluate",
          [](Trainer&, py::handle) -> py::object {
            RaiseNotImplemented("Trainer.evaluate is not defined by this trainer");
          },
          "weights"_a);
}

}  // namespace
}  // namespace huddle::client::python

PYBIND11_MODULE(huddle_client, m) {
  using namespace huddle::client;
  using namespace huddle::client::python;
  m.doc() =
      "Huddle's client SDK for a trainer written in Python: join a federation with "
      "huddle_client.run(trainer, options). See client/python/README.md.";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  BindTypes(m);
  BindTrainer(m);
  m.def(
      "run",
      [](py::handle trainer, const ClientOptions& options) {
        if (!py::isinstance<Trainer>(trainer)) {
          throw py::type_error("run: the trainer must be a huddle_client.Trainer, not a " +
                               std::string(py::str(py::type::handle_of(trainer).attr("__name__"))));
        }
        RunPython(trainer, options);
      },
      "trainer"_a, "options"_a,
      R"(Runs the client until the coordinator ends the job (returns) or a fatal error (raises
huddle_client.Error). The GIL is released meanwhile; Ctrl-C stops the client and raises
KeyboardInterrupt. Call it from the main thread for Ctrl-C to reach it.)");
  m.def(
      "check_tensors",
      [](py::handle tensors, const std::vector<TensorInfo>& like) {
        return TensorsToPython(TensorsFromPython(tensors, like));
      },
      "tensors"_a, "like"_a,
      R"(The float32 arrays run() would take from `tensors` (a list in the model's order, or a
dict name -> tensor) for a model of `like` (JobInfo.tensors); raises TypeError or ValueError
naming the tensor otherwise. fit's result goes through the same check.)");
  m.def("version", &Version, "The client SDK's version.");
  m.def("build_revision", &BuildRevision,
        "The git revision the client SDK was built from (as `huddle --version` prints it).");
  m.attr("__version__") = Version();
}
