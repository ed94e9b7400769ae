// Client::declare and Client::create: where tensors go, and creating them on
// their shards. A create that takes several requests runs in two rounds
// (every shard checks all of its part, then every shard creates), so that
// a call psd would refuse anywhere creates nothing anywhere.
#include <algorithm>
#include <map>
#include <set>

#include "client/client_impl.h"
#include "common/finite.h"
#include "ps/client.h"

namespace ps {

void Client::declare(const std::vector<TensorSpec>& specs) {
  std::lock_guard lock(impl_->placement_mutex);
  for (const auto& s : specs) impl_->placement.add(s);
}

namespace {

// A create request's two forms: a check of everything the shard will get
// (values left out: the client checked them), then the real requests.
enum class CreateRound { kValidate, kCreate };

// What a create's earlier checks found new on a shard (create's
// pendingTensors / pendingBytes).
struct CreatePending {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

// One create request: `batch`'s parts of `specs`, each cut to its part.
kj::Promise<CreatePending> send_create(ShardConnection& c, const ShardBatch& batch,
                                       const std::vector<TensorSpec>& specs, CreateRound round,
                                       CreatePending pending = {}) {
  const bool validate = round == CreateRound::kValidate;
  auto req = c.shard.createRequest();
  req.setValidateOnly(validate);
  req.setValuesLeftOut(validate);
  if (validate) {
    req.setPendingTensors(pending.tensors);
    req.setPendingBytes(pending.bytes);
  }
  auto out = req.initSpecs(static_cast<unsigned>(batch.parts.size()));
  for (unsigned i = 0; i < batch.parts.size(); ++i) {
    const TensorSpec& full = specs[batch.parts[i].tensor];
    const Part& part = batch.parts[i].part;
    // All of the spec but its values (positional, every member named: a
    // member added to TensorSpec warns here until it is passed on).
    TensorSpec piece{
        part.stored_name, part.num_parts > 1 ? std::vector<uint64_t>{part.count} : full.shape,
        full.optimizer,   InitConfig{full.init.kind, full.init.a, full.init.b, full.init.seed, {}},
        full.trainable,   {},
        full.version};
    // Values and restored slots are cut to the part; left out when
    // validating, the slots' number kept.
    auto cut = [&](const std::vector<float>& v) {
      if (validate) return std::vector<float>();
      return std::vector<float>(v.begin() + part.offset, v.begin() + part.offset + part.count);
    };
    if (full.init.kind == InitKind::kValues) piece.init.values = cut(full.init.values);
    for (const auto& slot : full.slots) piece.slots.push_back(cut(slot));
    to_wire(piece, out[i]);
    if (part.num_parts > 1) {
      part_to_wire(PartMeta{full.name, full.shape, part.offset, part.index, part.num_parts},
                   out[i].initPart());
    }
  }
  return req.send().then([](capnp::Response<wire::Shard::CreateResults>&& reply) {
    return CreatePending{reply.getPendingTensors(), reply.getPendingBytes()};
  });
}

// What psd would refuse in values that its check round does not see.
void check_create_values(const TensorSpec& full) {
  if (full.init.kind == InitKind::kValues && full.init.values.size() != full.num_elements()) {
    throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) +
                      " elements but " + std::to_string(full.init.values.size()) +
                      " initial values");
  }
  if (!all_finite(full.init.values)) {
    throw RequestError("create: tensor '" + full.name + "' has a NaN or Inf initial value");
  }
  for (const auto& slot : full.slots) {
    if (slot.size() != full.num_elements()) {
      throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) +
                        " elements but a restored optimizer slot of " +
                        std::to_string(slot.size()));
    }
    if (!all_finite(slot))
      throw RequestError("create: tensor '" + full.name + "' has a NaN or Inf restored slot value");
  }
}

// One shard's check requests (`checks`, all for one shard), one after
// another, each told what those before found new: the shard's limits count
// the whole call, in requests that each fit its message limit (one request
// per shard broke the connection past it).
kj::Promise<void> check_in_turn(Reconnector& retry, Unanswered* unanswered,
                                std::shared_ptr<const std::vector<ShardBatch>> checks,
                                std::shared_ptr<const std::vector<TensorSpec>> specs, std::size_t i,
                                CreatePending pending) {
  if (i == checks->size()) return kj::READY_NOW;
  const ShardBatch* batch = &(*checks)[i];
  return counted(unanswered, batch->shard,
                 retry.call(batch->shard,
                            [batch, specs, pending](ShardConnection& c, int) {
                              return send_create(c, *batch, *specs, CreateRound::kValidate,
                                                 pending);
                            }))
      .then([&retry, unanswered, checks, specs, i](CreatePending found) {
        return check_in_turn(retry, unanswered, checks, specs, i + 1, found);
      });
}

// A create's declarations, taken back unless kept (the create succeeded):
// a shape psd refused stays declarable, and the next tensors land where they
// do on workers that never declared it. Not when anything was declared
// meanwhile (another thread's create, even of the same names): theirs
// stand, and so do these (a failed create must not take back a tensor that
// another thread's create of it has just succeeded with).
class Declarations {
 public:
  Declarations(Placement& placement, std::mutex& mutex, const std::vector<TensorSpec>& specs)
      : placement_(placement), mutex_(mutex) {
    std::lock_guard lock(mutex_);
    before_ = placement_.mark();
    try {
      for (const auto& s : specs) placement_.add(s);
    } catch (...) {
      placement_.rollback(before_);
      throw;
    }
    declared_ = placement_.adds();
  }
  Declarations(const Declarations&) = delete;
  ~Declarations() {
    if (kept_) return;
    std::lock_guard lock(mutex_);
    if (placement_.adds() == declared_) placement_.rollback(before_);
  }
  void keep() { kept_ = true; }

 private:
  Placement& placement_;
  std::mutex& mutex_;
  Placement::Mark before_;
  uint64_t declared_ = 0;  // placement_.adds() after ours
  bool kept_ = false;
};

// Where this call's tensors already are: (stored name, shard) of each piece,
// by logical name.
using Stored = std::map<std::string, std::vector<std::pair<std::string, int>>>;

// A tensor another client created placed otherwise (another placement
// policy, chunk_bytes or part_bytes, or another declaration order) would be
// created a second time where this client places it, and the two would
// train apart. Refused before anything is sent.
void refuse_other_placement(const Placement& placement, const std::vector<TensorSpec>& specs,
                            const Stored& stored) {
  for (const auto& spec : specs) {
    auto it = stored.find(spec.name);
    if (it == stored.end()) continue;
    const std::vector<Part>& parts = placement.at(spec.name).parts;
    for (const auto& entry : it->second) {
      // Not a structured binding: clang before 16 cannot capture those.
      const auto& name = entry.first;
      const auto& shard = entry.second;
      const bool ours = std::any_of(parts.begin(), parts.end(), [&](const Part& p) {
        return p.stored_name == name && p.shard == shard;
      });
      if (ours) continue;
      throw ConfigError("create: tensor '" + spec.name + "' exists as '" + name + "' on shard " +
                        std::to_string(shard) +
                        ", where this client does not place it: every worker must declare the "
                        "same tensors in the same order, with the same ClientOptions::placement, "
                        "chunk_bytes and part_bytes (nothing was created)");
    }
  }
}

}  // namespace

void Client::create(const std::vector<TensorSpec>& specs) {
  for (const auto& full : specs) check_create_values(full);
  Declarations declarations(impl_->placement, impl_->placement_mutex, specs);
  std::vector<std::string> names;
  // Each part's request carries its initial values and restored slots (or
  // nothing but the spec): batches are cut by what they really carry.
  std::vector<uint32_t> copies;
  for (const auto& s : specs) {
    names.push_back(s.name);
    copies.push_back((s.init.kind == InitKind::kValues ? 1 : 0) +
                     static_cast<uint32_t>(s.slots.size()));
  }
  if (num_shards() > 1) {
    std::set<std::string> wanted(names.begin(), names.end());
    Stored stored = impl_->every_shard<Stored>(
        [](ShardConnection& s) { return s.shard.listRequest().send(); },
        [this, &wanted](Stored& out, int shard, capnp::Response<wire::Shard::ListResults>& reply) {
          check_reply_list(impl_->shard_name_at(shard), "tensors", reply.getTensors());
          for (auto t : reply.getTensors()) {
            std::string full = t.hasPart() ? t.getPart().getFullName() : t.getName();
            if (wanted.count(full) != 0) out[full].emplace_back(t.getName(), shard);
          }
        },
        "create: ");
    std::lock_guard lock(impl_->placement_mutex);
    refuse_other_placement(impl_->placement, specs, stored);
  }
  auto batches = impl_->plan(names, copies);
  for (const ShardBatch& b : batches) {
    if (b.bytes <= impl_->max_payload_bytes) continue;
    // One part alone, with its values and slots, is over psd's limit.
    const std::string& name = names[b.parts.front().tensor];
    throw ConfigError("create: a part of '" + name +
                      "' with its initial values and restored optimizer slots takes " +
                      std::to_string(b.bytes) + " bytes, more than psd accepts in one message (" +
                      std::to_string(impl_->max_payload_bytes) +
                      "); raise psd --max_message_mb or lower ClientOptions::part_bytes");
  }
  auto shared_specs = std::make_shared<const std::vector<TensorSpec>>(specs);
  // Over several requests, every shard first checks all it will get,
  // values left out, before any creates: one refusal creates nothing
  // anywhere, and a shard's limits count every new tensor of the call.
  std::map<int, std::shared_ptr<std::vector<ShardBatch>>> checks;
  if (batches.size() > 1) {
    for (ShardBatch& b : impl_->plan(names, std::vector<uint32_t>(names.size(), 0))) {
      auto& list = checks[b.shard];
      if (!list) list = std::make_shared<std::vector<ShardBatch>>();
      list->push_back(std::move(b));
    }
  }
  auto create_round = [this, shared_specs](const std::vector<ShardBatch>& requests,
                                           Unanswered* unanswered) {
    kj::Vector<kj::Promise<void>> calls;
    for (const auto& b : requests) {
      auto sent = impl_->retry->call(b.shard, [b, shared_specs](ShardConnection& c, int) {
        return send_create(c, b, *shared_specs, CreateRound::kCreate);
      });
      calls.add(counted(unanswered, b.shard, kj::mv(sent)).then([this, shard = b.shard](auto&&) {
        impl_->shards[shard]->holds_model = true;
      }));
    }
    return kj::joinPromises(calls.releaseAsArray());
  };
  struct Done {};
  impl_->call<Done>(
      [this, shared_specs, create_round, batches = std::move(batches),
       checks = std::move(checks)](Unanswered* unanswered) mutable {
        kj::Vector<kj::Promise<void>> shards_checked;
        for (auto& [shard, list] : checks) {
          shards_checked.add(
              check_in_turn(*impl_->retry, unanswered, list, shared_specs, 0, CreatePending{}));
        }
        // The second round outlives this call: what it sends moves into it.
        return kj::joinPromises(shards_checked.releaseAsArray())
            .then([create_round, unanswered, batches = std::move(batches)]() mutable {
              return create_round(batches, unanswered);
            })
            .then([] { return Done{}; });
      },
      "create: ");
  declarations.keep();
}

}  // namespace ps
