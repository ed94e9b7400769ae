// Client::pull and Client::push, the data path's two directions side by
// side: tensors cut into per-shard batches (request_plan.h), one request
// per batch built and sent as pipelined messages, the replies reassembled
// into the caller's buffers and results.
#include <capnp/orphan.h>

#include "client/client_impl.h"
#include "common/finite.h"

namespace ps {

// --- pull ---

// Each batch: its request (names, the step to wait for, where large parts
// land), the call, then its reply taken apart into the caller's buffers.
kj::Promise<void> Client::Impl::pull_round(PullState& st, std::vector<std::size_t> which,
                                           int64_t min_step, int round) {
  kj::Vector<kj::Promise<void>> calls;
  for (std::size_t b : which) {
    const ShardBatch& batch = st.batches[b];
    calls.add(
        counted(st.unanswered, batch.shard,
                retry->call(
                    batch.shard,
                    [this, &st, b, min_step](ShardConnection& c, int attempt) {
                      const ShardBatch& batch = st.batches[b];
                      auto req = c.shard.pullRequest();
                      auto names_out = req.initNames(static_cast<unsigned>(batch.parts.size()));
                      for (unsigned i = 0; i < batch.parts.size(); ++i)
                        names_out.set(i, batch.parts[i].part.stored_name);
                      // A shard back from a restart at an older step may never reach the
                      // step asked for: read what it has (reconnector.h). Also when another
                      // call found it so after this one was asked for, its min_step older news.
                      const bool news = attempt > 0 || st.rollbacks_at_call != rollbacks_now();
                      req.setMinStep(news && c.rolled_back ? std::min(min_step, c.hello_step)
                                                           : min_step);
                      // Large parts come through shared memory where the connection has
                      // some (copied out when the reply is in), else are read from the
                      // socket straight into st.out (client_message_stream.h); held until
                      // the reply is in.
                      kj::Own<SharedBlocks> blocks;
                      if (c.arena) blocks = kj::heap<SharedBlocks>(c.arena);
                      std::vector<int64_t> shared_at(batch.parts.size(), -1);
                      for (unsigned i = 0; blocks && i < batch.parts.size(); ++i) {
                        if (auto offset =
                                take_shared(*blocks, batch.parts[i].part.count * sizeof(float)))
                          shared_at[i] = *offset;
                      }
                      if (blocks && !blocks->empty()) {
                        auto into = req.initInto(static_cast<unsigned>(batch.parts.size()));
                        for (unsigned i = 0; i < batch.parts.size(); ++i) {
                          if (shared_at[i] >= 0)
                            set_slice(into[i], *c.arena, shared_at[i],
                                      batch.parts[i].part.count * sizeof(float));
                        }
                      }
                      kj::Own<ClientMessageStream::Expectation> expect;
                      if (batch.bytes >= ClientMessageStream::kMinLandingBytes) {
                        std::vector<kj::ArrayPtr<kj::byte>> dest(batch.parts.size());
                        for (unsigned i = 0; i < batch.parts.size(); ++i) {
                          if (shared_at[i] >= 0) continue;
                          const PartRef& ref = batch.parts[i];
                          auto part = st.out[ref.tensor].subspan(ref.part.offset, ref.part.count);
                          dest[i] = kj::arrayPtr(reinterpret_cast<kj::byte*>(part.data()),
                                                 part.size_bytes());
                        }
                        expect = c.messages->expect(std::move(dest));
                        req.setTag(expect->tag());
                      }
                      st.from_shared[b].assign(batch.parts.size(), false);
                      return until_answered(
                                 req.send().then(
                                     [&c, &st, b, shared_at = std::move(shared_at)](
                                         capnp::Response<wire::Shard::PullResults>&& reply) {
                                       c.last_step =
                                           std::max(c.last_step, reply_step(c, reply.getStep()));
                                       // Out of shared memory before its blocks are released.
                                       const ShardBatch& batch = st.batches[b];
                                       auto tensors = reply.getTensors();
                                       for (unsigned i = 0;
                                            i < batch.parts.size() && i < tensors.size(); ++i) {
                                         if (shared_at[i] < 0 || tensors[i].getValues().size() != 0)
                                           continue;
                                         const PartRef& ref = batch.parts[i];
                                         std::memcpy(st.out[ref.tensor].data() + ref.part.offset,
                                                     c.arena->at(shared_at[i]),
                                                     ref.part.count * sizeof(float));
                                         st.from_shared[b][i] = true;
                                       }
                                       return kj::mv(reply);
                                     }),
                                 kj::mv(blocks))
                          .attach(kj::mv(expect));
                    }))
            .then([this, &st, b](capnp::Response<wire::Shard::PullResults>&& reply) {
              const ShardBatch& batch = st.batches[b];
              auto tensors = reply.getTensors();
              if (tensors.size() != batch.parts.size()) {
                throw RequestError(shard_name(*shards[batch.shard]) + " replied " +
                                   std::to_string(tensors.size()) + " tensors for " +
                                   std::to_string(batch.parts.size()) + " asked");
              }
              st.versions[b].resize(tensors.size());
              for (unsigned i = 0; i < tensors.size(); ++i) {
                const PartRef& ref = batch.parts[i];
                auto data = tensors[i].getValues();
                if (st.from_shared[b][i]) {
                  st.versions[b][i] = tensors[i].getVersion();
                  continue;
                }
                if (data.size() != ref.part.count * sizeof(float)) {
                  throw RequestError(shard_name(*shards[batch.shard]) + " replied " +
                                     std::to_string(data.size()) + " bytes for tensor '" +
                                     ref.part.stored_name + "' of " +
                                     std::to_string(ref.part.count * sizeof(float)) +
                                     " bytes (was it created with another shape or chunk size?)");
                }
                float* dest = st.out[ref.tensor].data() + ref.part.offset;
                if (data.begin() != reinterpret_cast<const kj::byte*>(dest))
                  std::memcpy(dest, data.begin(), data.size());
                st.versions[b][i] = tensors[i].getVersion();
              }
              st.steps[b] = reply.getStep();
            }));
  }
  return kj::joinPromises(calls.releaseAsArray()).then([this, &st, round]() -> kj::Promise<void> {
    if (job_mode.load() != SyncMode::kSync || st.steps.empty() || st.aligned_by_caller)
      return kj::READY_NOW;
    const int64_t newest = *std::max_element(st.steps.begin(), st.steps.end());
    std::vector<std::size_t> behind;
    for (std::size_t b = 0; b < st.steps.size(); ++b) {
      // A shard restarted from an older checkpoint cannot reach the
      // others' step until training, at its step, brings it there
      // (pushes for its step are stale elsewhere): waiting for it would
      // wait for good. Its values are read as they are.
      if (st.steps[b] < newest && !shards[st.batches[b].shard]->catching_up) behind.push_back(b);
    }
    if (behind.empty()) {
      std::vector<std::pair<uint32_t, int64_t>> reads;
      for (std::size_t b = 0; b < st.steps.size(); ++b)
        reads.emplace_back(static_cast<uint32_t>(st.batches[b].shard), st.steps[b]);
      note_caught_up(reads);
      return kj::READY_NOW;
    }
    if (round >= 16)
      throw RequestError("shards kept moving to new steps; could not read one consistent step");
    return pull_round(st, std::move(behind), newest, round + 1);
  });
}

std::future<PullResult> Client::pull_async(std::vector<std::string> names,
                                           std::vector<std::span<float>> out, int64_t min_step) {
  return start_pull(std::move(names), std::move(out), min_step, nullptr);
}

std::future<PullResult> Client::start_pull(std::vector<std::string> names,
                                           std::vector<std::span<float>> out, int64_t min_step,
                                           PullResult* done) {
  if (names.size() != out.size())
    throw ConfigError("pull: " + std::to_string(names.size()) + " names but " +
                      std::to_string(out.size()) + " buffers");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const uint64_t n = impl_->tensor_elements(names[i]);
    if (out[i].size() != n) {  // a wrong size is a RequestError, as for a push
      throw RequestError("pull: buffer for '" + names[i] + "' holds " +
                         std::to_string(out[i].size()) + " floats, tensor has " +
                         std::to_string(n));
    }
  }
  auto batches = impl_->plan(names);
  const uint64_t rollbacks_at_call = rollbacks();
  return impl_->run<PullResult>(
      [this, batches = std::move(batches), out = std::move(out), n = names.size(), min_step,
       rollbacks_at_call](Unanswered* unanswered) mutable {
        auto state = kj::heap<Impl::PullState>();
        state->rollbacks_at_call = rollbacks_at_call;
        state->unanswered = unanswered;
        state->batches = std::move(batches);
        state->out = std::move(out);
        state->steps.assign(state->batches.size(), 0);
        state->versions.resize(state->batches.size());
        state->from_shared.resize(state->batches.size());
        std::vector<std::size_t> all(state->batches.size());
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
        auto* raw = state.get();
        return impl_->pull_round(*raw, std::move(all), min_step, 0)
            .then([state = kj::mv(state), n]() mutable {
              PullResult result;
              result.versions.assign(n, std::numeric_limits<uint64_t>::max());
              result.step = state->steps.empty() ? 0 : state->steps[0];
              for (std::size_t b = 0; b < state->batches.size(); ++b) {
                result.step = std::min(result.step, state->steps[b]);
                for (std::size_t i = 0; i < state->batches[b].parts.size(); ++i) {
                  auto& v = result.versions[state->batches[b].parts[i].tensor];
                  v = std::min(v, state->versions[b][i]);
                }
              }
              return result;
            });
      },
      "pull: ", done);
}

PullResult Client::pull(const std::vector<std::string>& names,
                        const std::vector<std::span<float>>& out, int64_t min_step) {
  PullResult result;
  start_pull(names, out, min_step, &result);
  return result;
}

uint64_t Client::pull(const std::string& name, std::span<float> out) {
  return pull(std::vector<std::string>{name}, std::vector<std::span<float>>{out}).versions.at(0);
}

std::vector<float> Client::pull(const std::string& name) {
  std::vector<float> values(impl_->tensor_elements(name));
  pull(name, values);
  return values;
}

// --- push ---

namespace {

// psd refuses a gradient with NaN or Inf, and the request it came in,
// whole; but a push that goes out as several requests (a tensor over
// several shards, or more than ClientOptions::max_request_bytes) would then
// have its other requests applied. Such a push is checked here first, so
// that one refused is refused whole, with psd's own message. Only the parts
// bound for shards that refuse them (psd without --allow_nonfinite) count.
// In sync mode psd also refuses values over about FLT_MAX / replicas_to_aggregate
// (their sum would overflow): `summed` is that divisor, 1 otherwise.
// A push that reports a step (done_step >= 0) also sends a stepDone to each
// shard it has no gradient for: those count as requests too, or a refused
// push would still have its step counted there.
void refuse_nonfinite_split_push(const std::vector<ShardBatch>& batches,
                                 const std::vector<std::string>& names,
                                 const std::vector<std::span<const float>>& grads,
                                 const std::vector<kj::Own<ShardConnection>>& shards,
                                 int64_t done_step, uint32_t summed) {
  const bool step_reports_elsewhere = done_step >= 0 && shards.size() > 1;
  if (batches.size() < 2 && !step_reports_elsewhere) return;
  const float limit = gradient_limit(summed);
  for (const ShardBatch& batch : batches) {
    const ShardConnection* shard = shards[batch.shard].get();
    if (shard != nullptr && shard->allows_nonfinite) continue;
    for (const PartRef& ref : batch.parts) {
      const auto part = grads[ref.tensor].subspan(ref.part.offset, ref.part.count);
      if (!all_finite(part, limit))
        throw RequestError(gradient_refusal(names[ref.tensor], part, summed));
    }
  }
}

}  // namespace

// Each batch: its request (gradients from the caller's memory or shared
// memory, the step, the request id, the step report on the first message
// to each shard), the call, then its reply folded into the result.
kj::Promise<PushResult> Client::Impl::push_round(std::vector<ShardBatch> batches,
                                                 std::vector<std::span<const float>> grads,
                                                 std::size_t tensors, int64_t step,
                                                 int64_t done_step, Unanswered* unanswered) {
  auto result = kj::heap<PushResult>();
  result->status.assign(tensors, PushStatus::kApplied);
  result->step = std::numeric_limits<int64_t>::max();
  kj::Vector<kj::Promise<void>> calls;
  auto shared_grads = std::make_shared<const std::vector<std::span<const float>>>(std::move(grads));
  struct BatchReply {
    std::vector<PushStatus> status;
    int64_t step = 0;
    bool stop = false;
  };
  // The step report rides on the first message to each shard; shards
  // that get no gradient get a stepDone of their own.
  std::vector<bool> reported(shards.size(), done_step < 0);
  for (auto& b : batches) {
    // One id per message, kept across retries: the shard applies it once.
    const uint64_t id = new_request_id();
    auto batch = std::make_shared<const ShardBatch>(std::move(b));
    const int64_t reports = reported[batch->shard] ? -1 : done_step;
    reported[batch->shard] = true;
    auto send = [this, batch, shared_grads, step, id, reports](
                    ShardConnection& c, int attempt) -> kj::Promise<BatchReply> {
      if (attempt > 0 && c.rolled_back && job_mode.load() == SyncMode::kSync &&
          step > c.hello_step) {
        // The shard restarted from a step before this gradient's: it
        // was computed from parameters the shard no longer has.
        return BatchReply{std::vector<PushStatus>(batch->parts.size(), PushStatus::kStale),
                          c.hello_step};
      }
      auto req = c.shard.pushRequest();
      req.setStep(step);
      req.setRequestId(id);
      req.setDoneStep(reports);
      auto list = req.initGrads(static_cast<unsigned>(batch->parts.size()));
      auto orphanage = capnp::Orphanage::getForMessageContaining(
          static_cast<wire::Shard::PushParams::Builder>(req));
      // Large parts through shared memory where the connection has some.
      kj::Own<SharedBlocks> blocks;
      if (c.arena) blocks = kj::heap<SharedBlocks>(c.arena);
      bool from_caller = false;  // some values go out from the caller's buffer
      for (unsigned i = 0; i < batch->parts.size(); ++i) {
        const PartRef& ref = batch->parts[i];
        list[i].setName(ref.part.stored_name);
        auto bytes = as_data((*shared_grads)[ref.tensor].subspan(ref.part.offset, ref.part.count));
        if (auto offset = blocks ? take_shared(*blocks, bytes.size()) : std::nullopt) {
          std::memcpy(blocks->arena().at(*offset), bytes.begin(), bytes.size());
          set_slice(list[i].initShared(), blocks->arena(), *offset, bytes.size());
        } else if (reinterpret_cast<uintptr_t>(bytes.begin()) % sizeof(capnp::word) == 0 &&
                   bytes.size() % sizeof(capnp::word) == 0) {
          // The gradient goes out straight from the caller's buffer: no copy.
          list[i].adoptValues(orphanage.referenceExternalData(bytes));
          from_caller = true;
        } else {
          // External data is sent in whole words: a buffer not a
          // multiple of 8 bytes (or not aligned) would be read past
          // its end. Copy those.
          list[i].setValues(bytes);
        }
      }
      auto sent = until_answered(req.send(), kj::mv(blocks));
      if (from_caller) sent = cut_if_abandoned(kj::mv(sent), c.messages->connection().weak());
      return sent.then([&c, batch](capnp::Response<wire::Shard::PushResults>&& reply) {
        // One status per gradient sent, in order: a missing one would read
        // as applied, an extra one as another tensor's.
        auto status = reply.getStatus();
        if (status.size() != batch->parts.size()) {
          throw RequestError(shard_name(c) + " replied " + std::to_string(status.size()) +
                             " statuses for " + std::to_string(batch->parts.size()) + " gradients");
        }
        BatchReply r;
        for (auto st : status) r.status.push_back(from_wire(st));
        r.step = reply_step(c, reply.getStep());
        r.stop = reply.getStop();
        c.last_step = std::max(c.last_step, r.step);
        return r;
      });
    };
    calls.add(counted(unanswered, batch->shard, retry->call_identified(batch->shard, kj::mv(send)))
                  .then([batch, reports, res = result.get()](BatchReply&& reply) {
                    if (reports >= 0) {
                      if (batch->shard == 0) res->global_step = reply.step;
                      res->stop = res->stop || reply.stop;
                    }
                    for (unsigned i = 0; i < reply.status.size(); ++i) {
                      auto& slot = res->status[batch->parts[i].tensor];
                      slot = std::max(slot, reply.status[i]);
                    }
                    res->step = std::min(res->step, reply.step);
                  }));
  }
  for (std::size_t shard = 0; shard < reported.size(); ++shard) {
    if (reported[shard]) continue;
    const uint64_t id = new_request_id();  // kept across retries, as a push's
    auto send = [done_step, id](ShardConnection& c, int) {
      return send_step_done(c, done_step, id);
    };
    calls.add(counted(unanswered, static_cast<int>(shard),
                      retry->call_identified(static_cast<int>(shard), kj::mv(send)))
                  .then([shard, res = result.get()](
                            capnp::Response<wire::Shard::StepDoneResults>&& reply) {
                    if (shard == 0) res->global_step = reply.getGlobalStep();
                    res->stop = res->stop || reply.getStop();
                  }));
  }
  return kj::joinPromises(calls.releaseAsArray()).then([result = kj::mv(result)]() mutable {
    if (result->step == std::numeric_limits<int64_t>::max()) result->step = 0;
    return std::move(*result);
  });
}

std::future<PushResult> Client::push_async(std::vector<std::string> names,
                                           std::vector<std::span<const float>> grads,
                                           int64_t step) {
  return start_push(std::move(names), std::move(grads), step, nullptr);
}

PushResult Client::push_and_step(const std::vector<std::string>& names,
                                 const std::vector<std::span<const float>>& grads, int64_t step,
                                 int64_t done_step) {
  PushResult result;
  start_push(names, grads, step, &result, done_step);
  return result;
}

std::future<PushResult> Client::push_and_step_async(std::vector<std::string> names,
                                                    std::vector<std::span<const float>> grads,
                                                    int64_t step, int64_t done_step) {
  return start_push(std::move(names), std::move(grads), step, nullptr, done_step);
}

std::future<PushResult> Client::start_push(std::vector<std::string> names,
                                           std::vector<std::span<const float>> grads, int64_t step,
                                           PushResult* done, int64_t done_step) {
  impl_->check_push("push", names, grads, done_step);
  auto batches = impl_->plan(names);
  const uint32_t summed = impl_->summed_per_step();
  return impl_->run<PushResult>(
      [this, batches = std::move(batches), names = std::move(names), grads = std::move(grads), step,
       done_step, summed](Unanswered* unanswered) mutable {
        if (impl_->options.check_split_pushes) {
          refuse_nonfinite_split_push(batches, names, grads, impl_->shards, done_step, summed);
        }
        return impl_->push_round(std::move(batches), std::move(grads), names.size(), step,
                                 done_step, unanswered);
      },
      "push: ", done);
}

PushResult Client::push(const std::vector<std::string>& names,
                        const std::vector<std::span<const float>>& grads, int64_t step) {
  PushResult result;
  start_push(names, grads, step, &result);
  return result;
}

PushStatus Client::push(const std::string& name, std::span<const float> grad) {
  return push(std::vector<std::string>{name}, std::vector<std::span<const float>>{grad})
      .status.at(0);
}

}  // namespace ps
