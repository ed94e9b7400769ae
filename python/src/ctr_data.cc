// Click-through data for Python trainers (include/ps/ctr_data.h,
// ctr_synthetic.h, binary_metrics.h): the features ctr_trainer makes, as
// NumPy arrays, and the metrics it reports. Parsing and generating run with
// the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ps/binary_metrics.h"
#include "ps/ctr_data.h"
#include "ps/ctr_synthetic.h"
#include "ps/errors.h"
#include "python/src/array_buffer.h"
#include "python/src/bindings.h"

namespace psclient_py {
namespace {

// The examples' features as ctr_trainer's steps take them (ps::make_ctr_batch's
// layout), written straight into the arrays (no second copy of a large file's
// features), plus the planted model's click probabilities where there is one.
// Bytes of features() arrays per example: label, dense, ids, wide ids (26 + 13 crosses).
constexpr std::size_t kFeatureBytes =
    sizeof(float) * (1 + ps::kCtrDense) + sizeof(uint64_t) * (2 * ps::kCtrCategorical + 13);

// Worker `worker` of `workers`, as the C++ code takes them (int).
void check_worker(const char* what, int64_t worker, int64_t workers) {
  if (workers < 1 || workers > INT_MAX || worker < 0 || worker >= workers) {
    throw py::value_error(std::string(what) + ": worker " + std::to_string(worker) + " of " +
                          std::to_string(workers) + " workers");
  }
}

// CtrShareStream from Python: one call at a time (threads may share one).
struct LockedShareStream {
  LockedShareStream(const std::string& path, int worker, int workers, int64_t train_end)
      : stream(path, worker, workers, train_end) {}
  std::mutex mutex;
  ps::CtrShareStream stream;
};

py::dict features(const std::vector<ps::CtrExample>& examples, const std::vector<double>* planted) {
  const std::vector<ps::FieldCross> crosses = ps::default_ctr_crosses();
  const std::size_t n = examples.size(), wide = ps::kCtrCategorical + crosses.size();
  const auto sn = static_cast<py::ssize_t>(n);
  py::array_t<float> labels({sn}), dense({sn, py::ssize_t{ps::kCtrDense}});
  py::array_t<uint64_t> ids({sn, py::ssize_t{ps::kCtrCategorical}}),
      wide_ids({sn, static_cast<py::ssize_t>(wide)});
  float* l = labels.mutable_data();
  float* d = dense.mutable_data();
  uint64_t* c = ids.mutable_data();
  uint64_t* w = wide_ids.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::vector<uint64_t> row;
    for (std::size_t i = 0; i < n; ++i) {
      const ps::CtrExample& e = examples[i];
      l[i] = e.label;
      ps::ctr_dense_features(e, std::span<float>(d + i * ps::kCtrDense, ps::kCtrDense));
      ps::ctr_categorical_ids(
          e, std::span<uint64_t>(c + i * ps::kCtrCategorical, ps::kCtrCategorical));
      ps::ctr_wide_ids(e, crosses, row);
      std::copy(row.begin(), row.end(), w + i * wide);
    }
  }
  py::dict out;
  out["labels"] = labels;
  out["dense"] = dense;
  out["ids"] = ids;
  out["wide_ids"] = wide_ids;
  if (planted != nullptr) {
    py::array_t<double> p({sn});
    if (n > 0) std::memcpy(p.mutable_data(), planted->data(), n * sizeof(double));
    out["planted"] = p;
  }
  return out;
}

// A metric of 0/1 labels (float32) and click probabilities (any numbers,
// read as float64), checked to be as many.
template <class Metric>
double binary_metric(py::handle labels, py::handle probs, const char* what, Metric metric) {
  ArrayBuffer l = ArrayBuffer::floats(labels, false, std::string(what) + ": labels");
  auto p = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(probs);
  if (!p) throw py::type_error(std::string(what) + ": probabilities must be an array of numbers");
  if (static_cast<std::size_t>(p.size()) != l.size()) {
    throw py::value_error(std::string(what) + ": " + std::to_string(p.size()) +
                          " probabilities for " + std::to_string(l.size()) + " labels");
  }
  return metric(std::span<const float>(l.span()),
                std::span<const double>(p.data(), static_cast<std::size_t>(p.size())));
}

// ps::read_ctr_share with the GIL released, taking it a quarter of a second
// apart: Ctrl-C ends the read (Python's handlers run then), and `progress`,
// unless None, is called about every 5 s.
ps::CtrShare read_share(const std::string& path, ps::CtrShareOptions opt,
                        const py::object& progress) {
  opt.extra_bytes_each = kFeatureBytes;  // the arrays made of the examples, beside them
  opt.progress_seconds = 0.25;
  auto next_report = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  opt.progress = [&](const std::string& doing, uint64_t done, uint64_t total) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    const auto now = std::chrono::steady_clock::now();
    if (progress.is_none() || now < next_report) return;
    next_report = now + std::chrono::seconds(5);
    progress(doing, done, total);
  };
  py::gil_scoped_release nogil;
  return ps::read_ctr_share(path, opt);
}

}  // namespace

void bind_ctr_data(py::module_& m) {
  // pybind11 sets up its NumPy API on the first array it makes; made here, at
  // import, two threads' first arrays cannot race on that set-up.
  (void)py::array_t<float>(0);
  m.def(
      "read_ctr",
      [](const std::string& path, int64_t max_examples) {
        ps::CtrShareOptions opt;  // one worker, nothing held out: every example, one pass
        opt.max_examples = max_examples;
        return features(read_share(path, opt, py::none()).train, nullptr);
      },
      py::arg("path"), py::arg("max_examples") = -1,
      R"(Reads a click-through file into the features ctr_trainer trains on, as a
dict of NumPy arrays. The layout is Criteo's TSV (label, I1..I13, C1..C26) or a
CSV with a header line, as Avazu's train.csv (docs/ctr.md, "Data layout"):

    d = psclient.read_ctr("data/ctr/train.tsv")
    d["labels"]    # (N,) float32, 0 or 1
    d["dense"]     # (N, 13) float32, sign(x) * log(1 + |x|), 0 where missing
    d["ids"]       # (N, 26) uint64, one id per categorical field (its own id when missing)
    d["wide_ids"]  # (N, 39) uint64, the 26 ids, then one per cross of neighbouring fields

The ids are ctr_trainer's (include/ps/ctr_data.h), so tables and checkpoints
are shared with it. A malformed line raises ConfigError "path:line: why";
Ctrl-C ends a long read. read_ctr_share reads one worker's part of a file
instead.)");

  m.def(
      "read_ctr_share",
      [](const std::string& path, double holdout, int64_t worker, int64_t workers, bool keep_train,
         bool keep_holdout, int64_t max_examples, py::object progress) {
        check_worker("read_ctr_share", worker, workers);
        if (!progress.is_none() && !PyCallable_Check(progress.ptr())) {
          throw py::type_error(
              "read_ctr_share: progress must be callable(doing, done_bytes, total_bytes)");
        }
        ps::CtrShareOptions opt;
        opt.worker = static_cast<int>(worker);
        opt.workers = static_cast<int>(workers);
        opt.holdout = holdout;
        opt.keep_train = keep_train;
        opt.keep_holdout = keep_holdout;
        opt.max_examples = max_examples;
        const ps::CtrShare share = read_share(path, opt, progress);
        py::dict d;
        d["train"] = keep_train ? py::object(features(share.train, nullptr)) : py::none();
        d["holdout"] = keep_holdout ? py::object(features(share.holdout, nullptr)) : py::none();
        d["examples"] = share.examples;
        d["train_end"] = share.train_end;
        return d;
      },
      py::arg("path"), py::kw_only(), py::arg("holdout") = 0.1, py::arg("worker") = 0,
      py::arg("workers") = 1, py::arg("keep_train") = true, py::arg("keep_holdout") = false,
      py::arg("max_examples") = -1, py::arg("progress") = py::none(),
      R"(One worker's part of a click-through file, as ctr_trainer splits it: the
last `holdout` of the examples are held out; the worker keeps the training
examples i with i % workers == worker (the others' lines are counted, not
parsed, so each of W workers holds and parses about 1/W of the file), and the
held-out ones with keep_holdout:

    s = psclient.read_ctr_share("train.csv", holdout=0.1, worker=1, workers=3)
    s["train"]      # read_ctr's dict of this worker's training examples
    s["train_end"]  # training examples in the file, every worker's
    s["examples"]   # examples in the file
    chief = psclient.read_ctr_share(path, worker=0, workers=3, keep_holdout=True)
    chief["holdout"]  # read_ctr's dict of the held-out examples (else None)

`progress(doing, done_bytes, total_bytes)`, if given, is called about every
5 s (a large file takes minutes); Ctrl-C ends the read. A malformed line among
those kept raises ConfigError "path:line: why".)");

  py::class_<LockedShareStream>(
      m, "CtrShareStream",
      R"(A worker's training share of a file, batch by batch, for files larger than
memory: read_ctr_share's "train" examples, in the same order, with only the
batch in memory; at the share's end a batch is cut short and the next starts
over from the file's beginning.

    counted = psclient.read_ctr_share(path, holdout=0.1, worker=1, workers=3, keep_train=False)
    stream = psclient.CtrShareStream(path, 1, 3, counted["train_end"])
    batch = stream.next(512)    # read_ctr's dict of the next (up to) 512 examples)")
      .def(
          py::init([](const std::string& path, int64_t worker, int64_t workers, int64_t train_end) {
            check_worker("CtrShareStream", worker, workers);
            return std::make_unique<LockedShareStream>(path, static_cast<int>(worker),
                                                       static_cast<int>(workers), train_end);
          }),
          py::arg("path"), py::arg("worker"), py::arg("workers"), py::arg("train_end"),
          "ConfigError when the worker has no training examples.")
      .def_property_readonly(
          "share_size", [](const LockedShareStream& s) { return s.stream.share_size(); },
          "Training examples in this worker's share.")
      .def(
          "next",
          [](LockedShareStream& self, std::size_t n) {
            std::vector<ps::CtrExample> batch;
            {
              py::gil_scoped_release nogil;
              const std::lock_guard lock(self.mutex);
              self.stream.next(n, batch);
            }
            return features(batch, nullptr);
          },
          py::arg("n"),
          "The next up to n examples, as read_ctr's dict (ConfigError for a malformed line, or "
          "a file that has shrunk since it was counted; the next call then starts the share "
          "over).");

  m.def(
      "ctr_synthetic",
      [](int64_t examples, uint64_t seed, int64_t max_distinct, double holdout,
         const std::string& part, int64_t worker, int64_t workers) {
        if (part != "train" && part != "holdout")
          throw py::value_error("ctr_synthetic: part must be 'train' or 'holdout', got '" + part +
                                "'");
        check_worker("ctr_synthetic", worker, workers);
        ps::CtrSyntheticOptions opt;
        opt.examples = examples;
        opt.seed = seed;
        opt.max_distinct = max_distinct;
        opt.holdout_fraction = holdout;
        opt.validate();
        std::vector<ps::CtrExample> out;
        std::vector<double> planted;
        const ps::CtrSynthetic gen(opt);
        // Example i is a function of (seed, i): each worker draws its own share.
        const int64_t begin = part == "train" ? worker : gen.holdout_begin();
        const int64_t end = part == "train" ? gen.holdout_begin() : examples;
        const int64_t stride = part == "train" ? workers : 1;
        const int64_t count =
            part == "train" ? ps::ctr_share_size(end, worker, workers) : end - begin;
        // The features' arrays and the probabilities, beside the examples.
        ps::check_ctr_examples_fit(
            count, kFeatureBytes + sizeof(double),
            "ctr_synthetic(" + std::to_string(examples) + ", part='" + part + "')");
        out.reserve(static_cast<std::size_t>(count));
        planted.reserve(static_cast<std::size_t>(count));
        // In chunks, the GIL taken between them for Python's signal handlers:
        // Ctrl-C ends a long draw.
        constexpr int64_t kChunk = 1 << 16;
        for (int64_t i = begin; i < end;) {
          {
            py::gil_scoped_release nogil;
            for (int64_t k = 0; k < kChunk && i < end; ++k, i += stride)
              planted.push_back(gen.example(i, out.emplace_back()));
          }
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        }
        return features(out, &planted);
      },
      py::arg("examples"), py::kw_only(), py::arg("seed") = 1,
      py::arg("max_distinct") = ps::CtrSyntheticOptions{}.max_distinct,
      py::arg("holdout") = ps::CtrSyntheticOptions{}.holdout_fraction, py::arg("part") = "train",
      py::arg("worker") = 0, py::arg("workers") = 1,
      R"(Examples from ctr_trainer's planted logistic model (--synthetic), in memory,
as read_ctr's dict plus "planted" (N,) float64, each example's true click
probability (the best any learner can predict):

    train = psclient.ctr_synthetic(1_000_000, part="train", worker=1, workers=3)  # every 3rd
    held = psclient.ctr_synthetic(1_000_000, part="holdout")   # the last `holdout` fraction
    best_auc = psclient.roc_auc(held["labels"], held["planted"])

The same (examples, seed, max_distinct, holdout) give the same examples as
ctr_trainer --synthetic and scripts/make_ctr_data.sh.)");

  m.def(
      "roc_auc",
      [](py::handle labels, py::handle probs) {
        return binary_metric(labels, probs, "roc_auc",
                             [](auto l, auto p) { return ps::roc_auc(l, p); });
      },
      py::arg("labels"), py::arg("probs"),
      "Area under the ROC curve of scores against 0/1 labels (float32), ties counted half; "
      "ctr_trainer's auc/holdout.");
  m.def(
      "log_loss",
      [](py::handle labels, py::handle probs) {
        return binary_metric(labels, probs, "log_loss",
                             [](auto l, auto p) { return ps::log_loss(l, p); });
      },
      py::arg("labels"), py::arg("probs"),
      "Mean cross-entropy of click probabilities against 0/1 labels (float32), probabilities "
      "clipped to [1e-15, 1 - 1e-15]; ctr_trainer's log_loss/holdout.");
}

}  // namespace psclient_py
