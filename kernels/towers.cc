// Towers: one engine per device, a batch split over them, gradients averaged.
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "ps/mlp.h"

namespace ps {

// Persistent threads for towers 1..n-1 (tower 0 runs on the caller's thread):
// starting threads per step would cost more than a small CPU step.
struct Towers::Pool {
  explicit Pool(int n) : errors(n) {
    for (int i = 1; i < n; ++i) threads.emplace_back([this, i] { loop(i); });
  }

  ~Pool() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    start_cv.notify_all();
    for (auto& t : threads) t.join();
  }

  // fn(i) for every tower i, in parallel; rethrows the first failure.
  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard lock(mutex);
      job = &fn;
      remaining = static_cast<int>(threads.size());
      ++generation;
    }
    start_cv.notify_all();
    try {
      fn(0);
      errors[0] = nullptr;
    } catch (...) {
      errors[0] = std::current_exception();
    }
    std::unique_lock lock(mutex);
    done_cv.wait(lock, [this] { return remaining == 0; });
    job = nullptr;
    for (auto& e : errors)
      if (e) std::rethrow_exception(std::exchange(e, nullptr));
  }

  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock lock(mutex);
        start_cv.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        fn = job;
      }
      std::exception_ptr error;
      try {
        (*fn)(i);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex);
        errors[i] = error;
        if (--remaining == 0) done_cv.notify_one();
      }
    }
  }

  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors;
  std::mutex mutex;
  std::condition_variable start_cv, done_cv;
  const std::function<void(int)>* job = nullptr;
  uint64_t generation = 0;
  int remaining = 0;
  bool stop = false;
};

Towers::Towers(std::vector<std::unique_ptr<MlpEngine>> engines) : engines_(std::move(engines)) {
  if (engines_.empty()) throw ConfigError("Towers: no engines");
  for (auto& e : engines_) {
    if (!e) throw ConfigError("Towers: null engine");
    if (e->layout().total() != engines_[0]->layout().total() ||
        e->shape().to_string() != engines_[0]->shape().to_string())
      throw ConfigError("Towers: engines have different shapes");
  }
  pool_ = std::make_unique<Pool>(size());
}

Towers::~Towers() = default;
Towers::Towers(Towers&&) noexcept = default;
Towers& Towers::operator=(Towers&&) noexcept = default;

Towers Towers::make(const MlpShape& shape, const EngineOptions& options, int n) {
  if (n < 1) throw ConfigError(fmt::format("Towers: need at least one tower, got {}", n));
  std::vector<std::unique_ptr<MlpEngine>> engines;
  const bool gpu = options.prefer_gpu && cuda_device_count() >= options.device + n;
  for (int i = 0; i < n; ++i) {
    EngineOptions o = options;
    o.device = options.device + i;
    engines.push_back(gpu ? make_cuda_engine(shape, o) : make_cpu_engine(shape, o));
  }
  spdlog::info("MLP {}: {} tower(s) on {}: {}", shape.to_string(), n, gpu ? "GPUs" : "CPU",
               engines[0]->device_description());
  return Towers(std::move(engines));
}

int Towers::size() const { return static_cast<int>(engines_.size()); }
MlpEngine& Towers::engine(int i) { return *engines_.at(i); }
const ParamLayout& Towers::layout() const { return engines_[0]->layout(); }

int Towers::max_batch() const {
  // Batches are split evenly, so the smallest tower limits the share of each.
  int smallest = engines_[0]->max_batch();
  for (auto& e : engines_) smallest = std::min(smallest, e->max_batch());
  return smallest * size();
}

std::span<float> Towers::host_params() { return engines_[0]->host_params(); }
std::span<float> Towers::host_grads() { return engines_[0]->host_grads(); }

void Towers::upload_params() {
  std::span<const float> p0 = engines_[0]->host_params();
  pool_->run([&](int i) {
    if (i > 0) std::copy(p0.begin(), p0.end(), engines_[i]->host_params().begin());
    engines_[i]->upload_params();
  });
}

StepStats Towers::compute_gradients(std::span<const float> x, std::span<const int32_t> labels) {
  const int64_t batch = static_cast<int64_t>(labels.size());
  const size_t inputs = static_cast<size_t>(engines_[0]->shape().inputs);
  if (batch < 1) throw Error("Towers::compute_gradients: empty batch");
  if (batch > max_batch())
    throw Error(fmt::format("Towers::compute_gradients: batch of {} exceeds the limit of {}", batch,
                            max_batch()));
  if (x.size() != static_cast<size_t>(batch) * inputs)
    throw Error(fmt::format("Towers::compute_gradients: x has {} floats, expected {} x {}",
                            x.size(), batch, inputs));

  // Tower i gets rows [begin[i], begin[i+1]); the first (batch % n) get one more.
  const int n = size();
  std::vector<int64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) begin[i + 1] = begin[i] + batch / n + (i < batch % n ? 1 : 0);
  std::vector<StepStats> stats(n);
  pool_->run([&](int i) {
    const int64_t b = begin[i + 1] - begin[i];
    if (b == 0) return;
    stats[i] = engines_[i]->compute_gradients(x.subspan(begin[i] * inputs, b * inputs),
                                              labels.subspan(begin[i], b));
  });

  // Each tower holds the gradient of the mean over its rows: weight by rows.
  std::span<float> g0 = engines_[0]->host_grads();
  const float w0 = static_cast<float>(begin[1]) / static_cast<float>(batch);
  for (float& g : g0) g *= w0;
  StepStats total{0, 0, batch};
  for (int i = 0; i < n; ++i) {
    const int64_t b = begin[i + 1] - begin[i];
    if (b == 0) continue;
    total.loss += stats[i].loss * static_cast<double>(b) / static_cast<double>(batch);
    total.correct += stats[i].correct;
    if (i == 0) continue;
    const float w = static_cast<float>(b) / static_cast<float>(batch);
    std::span<const float> gi = engines_[i]->host_grads();
    for (size_t k = 0; k < g0.size(); ++k) g0[k] += w * gi[k];
  }
  return total;
}

void Towers::apply_sgd(float lr) {
  // On the host, then uploaded: every tower gets bit-identical parameters.
  std::span<float> p0 = engines_[0]->host_params();
  std::span<const float> g0 = engines_[0]->host_grads();
  for (size_t k = 0; k < p0.size(); ++k) p0[k] -= lr * g0[k];
  upload_params();
}

EvalStats Towers::evaluate(std::span<const float> x, std::span<const int32_t> labels) {
  const int64_t total_n = static_cast<int64_t>(labels.size());
  const size_t inputs = static_cast<size_t>(engines_[0]->shape().inputs);
  if (x.size() != static_cast<size_t>(total_n) * inputs)
    throw Error(fmt::format("Towers::evaluate: x has {} floats, expected {} x {}", x.size(),
                            total_n, inputs));
  if (total_n == 0) return {};
  const int n = size();
  std::vector<int64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) begin[i + 1] = begin[i] + total_n / n + (i < total_n % n ? 1 : 0);
  std::vector<EvalStats> stats(n);
  pool_->run([&](int i) {
    const int64_t b = begin[i + 1] - begin[i];
    if (b > 0)
      stats[i] = engines_[i]->evaluate(x.subspan(begin[i] * inputs, b * inputs),
                                       labels.subspan(begin[i], b));
  });
  EvalStats total{0, 0, total_n};
  for (int i = 0; i < n; ++i) {
    total.loss +=
        stats[i].loss * static_cast<double>(stats[i].count) / static_cast<double>(total_n);
    total.correct += stats[i].correct;
  }
  return total;
}

}  // namespace ps
