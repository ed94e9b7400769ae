// Conversions between the public value types (ps/tensor_spec.h) and their
// Cap'n Proto form (schema/ps.capnp). The one place that knows both.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <capnp/blob.h>

#include "common/part_meta.h"
#include "schema/ps.capnp.h"
#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

void to_wire(const OptimizerConfig& c, wire::OptimizerSpec::Builder out);
OptimizerConfig from_wire(wire::OptimizerSpec::Reader in);

void to_wire(const InitConfig& c, wire::Initializer::Builder out);
InitConfig from_wire(wire::Initializer::Reader in);

// Fills name, shape, optimizer, init and trainable (not the part info).
void to_wire(const TensorSpec& s, wire::TensorSpec::Builder out);
TensorSpec from_wire(wire::TensorSpec::Reader in);

JobConfig job_from_wire(wire::JobConfig::Reader in);  // throws RequestError
void job_to_wire(const JobConfig& c, wire::JobConfig::Builder out);

std::vector<uint64_t> shape_from_wire(capnp::List<uint64_t>::Reader in);

// Where a stored part sits in its logical tensor (TensorSpec.part).
void part_to_wire(const PartMeta& p, wire::PartInfo::Builder out);

// Float32 views of Data blobs (the wire format is little-endian float32,
// which is the host format on every platform psd builds for).
inline std::span<const float> as_floats(capnp::Data::Reader d) {
  return {reinterpret_cast<const float*>(d.begin()), d.size() / sizeof(float)};
}
inline capnp::Data::Reader as_data(std::span<const float> f) {
  return {reinterpret_cast<const capnp::byte*>(f.data()), f.size() * sizeof(float)};
}

}  // namespace ps
