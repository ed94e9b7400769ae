// The checks the row calls share (Client.pull_rows / push_rows,
// TrainingSession.set_rows), defined in tables.cc.
#pragma once

#include <string>

#include "ps/embedding.h"
#include "python/src/array_buffer.h"

namespace psclient_py {

// A row call's float array (rows a pull writes, gradients a push reads)
// against its ids: of shape ids.shape + (dim,) or (ids.size, dim), else
// ValueError starting with `what` ("set_rows: rows for 'user'").
void check_row_shape(const ps::TableSpec& spec, const ArrayBuffer& ids, const ArrayBuffer& rows,
                     const std::string& what);

}  // namespace psclient_py
