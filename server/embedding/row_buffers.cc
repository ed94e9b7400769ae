#include "server/embedding/row_buffers.h"

#include <algorithm>
#include <new>

namespace ps {
namespace {

constexpr std::size_t kAlign = 64;
// Buffers are cut in steps of this, so replies of nearly the same size share them.
constexpr std::size_t kStepFloats = (64u << 10) / sizeof(float);

float* allocate(std::size_t floats) {
  return static_cast<float*>(::operator new(floats * sizeof(float), std::align_val_t(kAlign)));
}

void release(float* data) { ::operator delete(data, std::align_val_t(kAlign)); }

}  // namespace

RowBuffers::RowBuffers(std::size_t max_spare_bytes)
    : state_(std::make_shared<State>(max_spare_bytes)) {}

RowBuffers::State::~State() {
  for (const Spare& s : spare) release(s.data);
}

void RowBuffers::State::give_back(float* data, std::size_t floats) {
  {
    std::lock_guard lock(mutex);
    if (spare_bytes + floats * sizeof(float) <= max_spare_bytes) {
      spare.push_back({data, floats});
      spare_bytes += floats * sizeof(float);
      return;
    }
  }
  release(data);
}

std::shared_ptr<float> RowBuffers::take(std::size_t floats) {
  floats = std::max<std::size_t>(1, (floats + kStepFloats - 1) / kStepFloats * kStepFloats);
  float* data = nullptr;
  std::size_t size = floats;
  {
    std::lock_guard lock(state_->mutex);
    // The smallest spare that holds it.
    auto best = state_->spare.end();
    for (auto it = state_->spare.begin(); it != state_->spare.end(); ++it) {
      if (it->floats >= floats && (best == state_->spare.end() || it->floats < best->floats))
        best = it;
    }
    if (best != state_->spare.end()) {
      data = best->data;
      size = best->floats;
      state_->spare_bytes -= size * sizeof(float);
      *best = state_->spare.back();
      state_->spare.pop_back();
    }
  }
  if (data == nullptr) data = allocate(size);
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<float>(data, [state, size](float* p) { state->give_back(p, size); });
}

std::size_t RowBuffers::spare_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->spare_bytes;
}

RowBuffers& RowBuffers::process() {
  // 4 MiB: a few replies in flight while the socket takes them; kept small,
  // as it adds to psd's memory beside the tables.
  static RowBuffers* pool = new RowBuffers(4u << 20);
  return *pool;
}

}  // namespace ps
