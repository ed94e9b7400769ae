// A shard's embedding tables: each table's rows (EmbeddingTable), its
// request counters and its sums for the current sync step. Held by Shard,
// used on its event loop only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/memory_budget.h"
#include "server/embedding/embedding_table.h"
#include "common/first_positions.h"

namespace ps {

// One table's gradients for the current sync step: per distinct id, the
// sum of the workers' gradients.
struct TableSyncSlot {
  FirstPositions position;  // id -> its index in ids
  std::vector<uint64_t> ids;
  std::vector<float> sum;  // ids.size() * dim
  uint32_t count = 0;      // workers that contributed
  std::vector<int> contributors;
  bool complete = false;
  // Every push summed was within half the table's safe bound for its own
  // ids (C / (2 n) for n ids, C the optimizer's constant): each id's sum is
  // then within count C / 2, its average within C / 2, and the step's
  // update needs no check pass.
  bool within_bound = true;
  // Rows of ids the step's pushes named that the table did not hold: what
  // the commit will create, charged against psd's memory as each push came.
  uint64_t new_rows = 0;
  uint64_t bytes() const {
    return position.bytes() + ids.capacity() * sizeof(uint64_t) + sum.capacity() * sizeof(float);
  }
  // What reserve(ids, more, dim) adds to bytes().
  uint64_t growth(std::size_t ids, std::size_t more, uint32_t dim) const {
    const std::size_t want = this->ids.size() + more;
    return position.bytes_after_reserve(ids) - position.bytes() +
           (want > this->ids.capacity() ? (want - this->ids.capacity()) * sizeof(uint64_t) : 0) +
           (want * dim > sum.capacity() ? (want * dim - sum.capacity()) * sizeof(float) : 0);
  }
  // Room for a push of `ids` ids, `more` of them new to the step: exactly
  // what growth() charged, not a doubling.
  void reserve(std::size_t ids, std::size_t more, uint32_t dim) {
    position.reserve(ids);
    this->ids.reserve(this->ids.size() + more);
    sum.reserve((this->ids.size() + more) * dim);
  }
  void clear() {
    position.clear();  // keeps its arrays for the next step
    ids.clear();
    sum.clear();
    count = 0;
    contributors.clear();
    complete = false;
    within_bound = true;
    new_rows = 0;
  }
};

struct ShardTable {
  std::unique_ptr<EmbeddingTable> table;
  uint32_t num_shards = 1;  // as the creating client placed it
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  TableSyncSlot sync;
};

struct ShardTables {
  // The tables' bytes in psd's memory budget (when it has one), brought up
  // to date at each create and before each check of new rows; declared
  // before the tables, so it is given back after they are freed.
  MemoryBudget::Reservation reserved;
  std::map<std::string, ShardTable, std::less<>> tables;

  // Throws RequestError naming `what` for a table that is not here.
  ShardTable& get(std::string_view name, const char* what);
  // Rows, slots and indexes, and each table's bookkeeping.
  uint64_t bytes() const;

  // What a table holds beyond its rows, slots and index (the EmbeddingTable,
  // its scratch sets, the map's node, its name): many small tables must not
  // hold more memory than the budget counts.
  static uint64_t bookkeeping_bytes(std::string_view name) {
    return kTableBookkeepingBytes + 3 * name.size();
  }
  static constexpr uint64_t kTableBookkeepingBytes = 8 << 10;
};

}  // namespace ps
