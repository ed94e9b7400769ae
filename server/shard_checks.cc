// Shard: checks shared by more than one path, each in one function, so the
// live requests and a restore from a checkpoint refuse alike.
#include <string>

#include "ps/errors.h"
#include "server/optimizer.h"
#include "server/shard.h"

namespace ps {

void Shard::check_can_be_ready() const {
  if (job_.configured() && job_.config().mode == SyncMode::kSync && trainable_count() == 0) {
    throw RequestError(
        "setReady: this shard holds no trainable tensor, and in sync mode a shard's global step "
        "moves "
        "only with its gradients: it would stay at step " +
        std::to_string(job_.global_step()) +
        " for good (more ps shards than variable parts? use fewer ps hosts, or a smaller chunk "
        "size)");
  }
}

void Shard::refuse_nonfinite_updates(const std::vector<PushGrad>& work) const {
  if (options_.allow_nonfinite) return;
  for (const PushGrad& g : work) {
    if (applied_on_arrival(g) && runs_inline(g.tensor) &&
        !g.tensor->update_finite(g.values, 1.0f, g.grad_max)) {
      throw RequestError("push: " + nonfinite_update_refusal(g.tensor->spec()));
    }
  }
}

}  // namespace ps
