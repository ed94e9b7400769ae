// Where a stored tensor sits in its logical tensor when a large tensor is
// split over shards (the wire's PartInfo). Shared by psd's store and the
// checkpoint files, which reassemble parts on restore.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps {

struct PartMeta {
  std::string full_name;
  std::vector<uint64_t> full_shape;
  uint64_t offset = 0;  // first element of the part in the flattened tensor
  uint32_t index = 0;
  uint32_t count = 1;  // number of parts
  bool operator==(const PartMeta&) const = default;
};

}  // namespace ps
