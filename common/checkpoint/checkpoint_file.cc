// One file for the one checkpoint format: writing, reading, listing and
// pruning share its framing, checksums and file names.
#include "common/checkpoint/checkpoint_file.h"

#include "common/embedding_wire.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "schema/checkpoint.capnp.h"
#include "ps/crc32c.h"
#include "common/wire_convert.h"

namespace ps {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr const char* kSuffix = ".psckpt";
// Files of this version on are read (schema/checkpoint.capnp's kFormatVersion
// says what each version added).
constexpr uint32_t kOldestFormatVersion = 1;

std::string errno_text() { return std::strerror(errno); }

// Fuzzing builds (-Dfuzz=true) read on past checksum mismatches, so that
// mutated files reach the parsing the checksums guard (fuzz/checkpoint_fuzz).
bool checksum_matches(uint32_t computed, uint32_t stored) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  (void)computed;
  (void)stored;
  return true;
#else
  return computed == stored;
#endif
}

// Buffered writer over a file descriptor; every error throws.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("checkpoint: cannot create " + path + ": " + errno_text());
    buffer_.reserve(1 << 20);
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  void append(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + n > buffer_.capacity()) flush();
    if (n >= buffer_.capacity()) {
      write_all(p, n);
    } else {
      buffer_.insert(buffer_.end(), p, p + n);
    }
  }
  void record(const void* data, std::size_t n) {
    const uint64_t len = n;
    const uint32_t len_crc = mask_crc(crc32c(&len, sizeof(len)));
    const uint32_t data_crc = mask_crc(crc32c(data, n));
    append(&len, sizeof(len));
    append(&len_crc, sizeof(len_crc));
    append(data, n);
    append(&data_crc, sizeof(data_crc));
  }
  void message(capnp::MessageBuilder& m) {
    auto words = capnp::messageToFlatArray(m);
    record(words.asBytes().begin(), words.asBytes().size());
  }
  void finish() {
    flush();
    if (::fsync(fd_) != 0) throw Error("checkpoint: fsync " + path_ + ": " + errno_text());
    if (::close(fd_) != 0) throw Error("checkpoint: close " + path_ + ": " + errno_text());
    fd_ = -1;
  }

 private:
  void flush() {
    write_all(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  void write_all(const char* p, std::size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw Error("checkpoint: write " + path_ + ": " + errno_text());
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  std::string path_;
  int fd_ = -1;
  std::vector<char> buffer_;
};

// Reads records back, checking lengths against the file size and every CRC.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) throw Error("checkpoint: cannot open " + path + ": " + errno_text());
    struct stat st {};
    if (::fstat(fileno(f_), &st) != 0)
      throw Error("checkpoint: stat " + path + ": " + errno_text());
    remaining_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileReader() { std::fclose(f_); }

  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError("checkpoint " + path_ + " is invalid: " + what + " (at byte " +
                          std::to_string(offset_) + ")");
  }
  void read(void* out, std::size_t n, const char* what) {
    if (n > remaining_) fail(std::string("truncated in ") + what);
    if (n > 0 && std::fread(out, 1, n, f_) != n) fail(std::string("read error in ") + what);
    remaining_ -= n;
    offset_ += n;
  }
  void header() {
    char magic[8];
    read(magic, sizeof(magic), "the file header");
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) fail("not a psd checkpoint (bad magic)");
    uint32_t version = 0, crc = 0;
    read(&version, sizeof(version), "the file header");
    read(&crc, sizeof(crc), "the file header");
    char head[12];
    std::memcpy(head, kMagic, 8);
    std::memcpy(head + 8, &version, 4);
    if (!checksum_matches(mask_crc(crc32c(head, sizeof(head))), crc))
      fail("header checksum mismatch");
    if (version < kOldestFormatVersion || version > ckpt::K_FORMAT_VERSION) {
      fail("format version " + std::to_string(version) + ", this build reads versions " +
           std::to_string(kOldestFormatVersion) + " to " + std::to_string(ckpt::K_FORMAT_VERSION));
    }
  }
  // Reads one record into `out` (resized), checking both CRCs.
  template <typename Vec>
  void record(Vec& out, const char* what) {
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    read(&len, sizeof(len), what);
    read(&len_crc, sizeof(len_crc), what);
    if (!checksum_matches(mask_crc(crc32c(&len, sizeof(len))), len_crc)) {
      fail(std::string("length checksum mismatch in ") + what);
    }
    if (len > remaining_ || remaining_ - len < sizeof(data_crc))
      fail(std::string("truncated in ") + what);
    if (len % sizeof(typename Vec::value_type) != 0)
      fail(std::string("odd record length in ") + what);
    out.resize(len / sizeof(typename Vec::value_type));
    read(out.data(), len, what);
    read(&data_crc, sizeof(data_crc), what);
    if (!checksum_matches(mask_crc(crc32c(out.data(), len)), data_crc)) {
      fail(std::string("data checksum mismatch in ") + what);
    }
  }
  bool at_end() const { return remaining_ == 0; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  uint64_t remaining_ = 0;
  uint64_t offset_ = 0;
};

// A Cap'n Proto message read from a checked record; the traversal limit is
// the record's own size (a few passes), so a hostile file cannot amplify.
struct MessageRecord {
  std::vector<uint64_t> words;  // capnp::word is not movable; same size and alignment
  kj::Own<capnp::FlatArrayMessageReader> reader;
  void read(FileReader& in, const char* what) {
    in.record(words, what);
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords =
        words.size() * 8 + 1024;  // a few passes over the record; no amplification beyond
    opts.nestingLimit = 32;
    try {
      reader = kj::heap<capnp::FlatArrayMessageReader>(
          kj::arrayPtr(reinterpret_cast<const capnp::word*>(words.data()), words.size()), opts);
    } catch (const kj::Exception& e) {
      in.fail(std::string("malformed ") + what + ": " + e.getDescription().cStr());
    }
  }
};

std::string step_name(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%012" PRId64 "%s", step, kSuffix);
  return name;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("checkpoint: open directory " + dir + ": " + errno_text());
  const int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) throw Error("checkpoint: fsync directory " + dir + ": " + errno_text());
}

void make_dirs(const std::string& path) {
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) == 0) {
      // A new directory's entry lives in its parent: synced too, or a power
      // cut could lose the first checkpoint written below it.
      const auto slash = prefix.find_last_of('/');
      fsync_dir(slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash));
    } else if (errno != EEXIST) {
      throw Error("checkpoint: cannot create directory " + prefix + ": " + errno_text());
    }
  }
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
  ::closedir(d);
  return out;
}

bool parse_step(const std::string& name, int64_t* step) {
  const std::string suffix = kSuffix;
  if (name.size() <= 5 + suffix.size() || name.rfind("ckpt-", 0) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const std::string digits = name.substr(5, name.size() - 5 - suffix.size());
  if (digits.empty() || digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return false;
  const uint64_t n = std::stoull(digits);  // 19 digits fit; kMaxStep has 19
  if (n > static_cast<uint64_t>(kMaxStep)) return false;
  *step = static_cast<int64_t>(n);
  return true;
}

bool parse_shard_dir(const std::string& name, uint32_t* index, uint32_t* count) {
  unsigned i = 0, n = 0;
  int used = 0;
  if (std::sscanf(name.c_str(), "shard-%u-of-%u%n", &i, &n, &used) != 2 ||
      used != static_cast<int>(name.size()))
    return false;
  if (n == 0 || i >= n) return false;
  *index = i;
  *count = n;
  return true;
}

}  // namespace

std::string shard_checkpoint_dir(const std::string& dir, uint32_t shard_index,
                                 uint32_t num_shards) {
  return dir + "/shard-" + std::to_string(shard_index) + "-of-" + std::to_string(num_shards);
}

void check_checkpoint_dir(const std::string& dir, uint32_t shard_index, uint32_t num_shards) {
  const std::string shard_dir = shard_checkpoint_dir(dir, shard_index, num_shards);
  make_dirs(shard_dir);
  const std::string probe = shard_dir + "/.write-test";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("checkpoint: cannot write in " + shard_dir + ": " + errno_text());
  ::close(fd);
  ::unlink(probe.c_str());
}

std::optional<uint64_t> checkpoint_tensor_count(const std::string& path) {
  try {
    FileReader in(path);
    in.header();
    MessageRecord rec;
    rec.read(in, "the checkpoint header");
    return rec.reader->getRoot<ckpt::Header>().getTensorCount();
  } catch (const std::exception&) {
    return std::nullopt;
  } catch (const kj::Exception&) {
    return std::nullopt;
  }
}

std::string write_checkpoint(const std::string& dir, const ShardCheckpoint& c, bool* kept_fuller) {
  if (kept_fuller != nullptr) *kept_fuller = false;
  const std::string sdir = shard_checkpoint_dir(dir, c.shard_index, c.num_shards);
  make_dirs(sdir);
  const std::string path = sdir + "/" + step_name(c.global_step);
  // The pid keeps two processes pointed at one directory by mistake from
  // writing into the same temporary file.
  const std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  try {
    FileWriter out(tmp);
    char head[16];
    std::memcpy(head, kMagic, 8);
    const uint32_t version = ckpt::K_FORMAT_VERSION;
    std::memcpy(head + 8, &version, 4);
    const uint32_t crc = mask_crc(crc32c(head, 12));
    std::memcpy(head + 12, &crc, 4);
    out.append(head, sizeof(head));
    {
      capnp::MallocMessageBuilder m;
      auto h = m.initRoot<ckpt::Header>();
      h.setShardIndex(c.shard_index);
      h.setNumShards(c.num_shards);
      h.setGlobalStep(c.global_step);
      h.setJobConfigured(c.job_configured);
      job_to_wire(c.job, h.initJob());
      h.setReady(c.ready);
      h.setUnixSecs(c.unix_secs);
      h.setTensorCount(c.tensors.size());
      h.setTableCount(c.tables.size());
      h.setServerVersion("psd");
      auto reqs =
          h.initRequests(static_cast<unsigned>(c.requests.size() + c.client_requests.size()));
      unsigned i = 0;
      auto put = [&](int worker, uint64_t client, const std::vector<RecentRequest>& recent) {
        reqs[i].setWorkerIndex(worker);
        reqs[i].setClientId(client);
        auto list = reqs[i].initRecent(static_cast<unsigned>(recent.size()));
        for (unsigned j = 0; j < recent.size(); ++j) {
          list[j].setId(recent[j].id);
          list[j].setStep(recent[j].step);
          list[j].setStatuses(kj::arrayPtr(recent[j].statuses.data(), recent[j].statuses.size()));
        }
        ++i;
      };
      for (const auto& [worker, recent] : c.requests) put(worker, 0, recent);
      for (const auto& [client, recent] : c.client_requests) put(-1, client, recent);
      out.message(m);
    }
    for (const auto& t : c.tensors) {
      capnp::MallocMessageBuilder m;
      auto h = m.initRoot<ckpt::TensorHeader>();
      TensorSpec spec = t.spec;
      spec.init = {};
      spec.slots.clear();
      spec.version = t.version;
      to_wire(spec, h.initSpec());
      if (t.part) part_to_wire(*t.part, h.getSpec().initPart());
      h.setNumSlots(static_cast<uint32_t>(t.slots.size()));
      h.setElements(t.values.size());
      out.message(m);
      out.record(t.values.data(), t.values.size() * sizeof(float));
      for (const auto& s : t.slots) {
        if (s.size() != t.values.size())
          throw Error("checkpoint: slot of '" + t.spec.name + "' has the wrong size");
        out.record(s.data(), s.size() * sizeof(float));
      }
    }
    for (const auto& t : c.tables) {
      capnp::MallocMessageBuilder m;
      auto h = m.initRoot<ckpt::TableHeader>();
      to_wire(t.spec, t.shard_index, t.num_shards, h.initSpec());
      h.setNumSlots(static_cast<uint32_t>(t.slots.size()));
      h.setRows(t.ids.size());
      h.setVersion(t.version);
      if (!t.ages.empty() && t.ages.size() != t.ids.size())
        throw Error("checkpoint: table '" + t.spec.name + "' has the wrong number of row ages");
      h.setAges(!t.ages.empty());
      if (t.sketch.size() != std::size_t{kSketchRows} * t.sketch_width)
        throw Error("checkpoint: table '" + t.spec.name + "' has a count sketch of the wrong size");
      h.setSketchKey(t.sketch_key);
      h.setSketchWidth(t.sketch_width);
      out.message(m);
      const std::size_t floats = t.ids.size() * t.spec.dim;
      if (t.values.size() != floats)
        throw Error("checkpoint: rows of table '" + t.spec.name + "' have the wrong size");
      out.record(t.ids.data(), t.ids.size() * sizeof(uint64_t));
      out.record(t.values.data(), floats * sizeof(float));
      for (const auto& s : t.slots) {
        if (s.size() != floats)
          throw Error("checkpoint: slot of table '" + t.spec.name + "' has the wrong size");
        out.record(s.data(), s.size() * sizeof(float));
      }
      if (!t.ages.empty()) out.record(t.ages.data(), t.ages.size() * sizeof(uint32_t));
      if (t.sketch_width != 0) out.record(t.sketch.data(), t.sketch.size());
    }
    {
      capnp::MallocMessageBuilder m;
      auto f = m.initRoot<ckpt::Footer>();
      f.setTensorCount(c.tensors.size());
      f.setTableCount(c.tables.size());
      out.message(m);
    }
    out.finish();
    // A file of the same step with more tensors (a restore left some out)
    // stays: this one goes beside it, under a name no restore reads.
    const std::optional<uint64_t> there = checkpoint_tensor_count(path);
    if (there && *there > c.tensors.size()) {
      const std::string aside = path + ".incomplete";
      if (::rename(tmp.c_str(), aside.c_str()) != 0)
        throw Error("checkpoint: rename " + tmp + ": " + errno_text());
      if (kept_fuller != nullptr) *kept_fuller = true;
      fsync_dir(sdir);
      return aside;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("checkpoint: rename " + tmp + ": " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(sdir);
  return path;
}

ShardCheckpoint read_checkpoint(const std::string& path) {
  FileReader in(path);
  in.header();
  ShardCheckpoint c;
  uint64_t count = 0;
  try {
    MessageRecord rec;
    rec.read(in, "the checkpoint header");
    auto h = rec.reader->getRoot<ckpt::Header>();
    c.shard_index = h.getShardIndex();
    c.num_shards = h.getNumShards();
    c.global_step = h.getGlobalStep();
    if (!step_in_range(c.global_step)) {
      in.fail("global step " + std::to_string(c.global_step) + " is out of range [0, 2^62]");
    }
    c.job_configured = h.getJobConfigured();
    c.job = job_from_wire(h.getJob());
    c.ready = h.getReady();
    c.unix_secs = h.getUnixSecs();
    count = h.getTensorCount();
    for (auto w : h.getRequests()) {
      auto& list = w.getWorkerIndex() < 0 && w.getClientId() != 0
                       ? c.client_requests[w.getClientId()]
                       : c.requests[w.getWorkerIndex()];
      for (auto r : w.getRecent()) {
        auto st = r.getStatuses();
        list.push_back({r.getId(), r.getStep(), std::vector<uint8_t>(st.begin(), st.end())});
      }
    }
    for (uint64_t i = 0; i < count; ++i) {
      if (in.at_end())
        in.fail("truncated: " + std::to_string(i) + " of " + std::to_string(count) + " tensors");
      MessageRecord th;
      th.read(in, "a tensor header");
      auto t = th.reader->getRoot<ckpt::TensorHeader>();
      TensorCheckpoint tc;
      tc.spec = from_wire(t.getSpec());
      tc.version = t.getSpec().getVersion();
      if (t.getSpec().hasPart()) {
        auto p = t.getSpec().getPart();
        tc.part =
            PartMeta{std::string(p.getFullName().begin(), p.getFullName().size()),
                     shape_from_wire(p.getFullShape()), p.getOffset(), p.getIndex(), p.getCount()};
      }
      const uint64_t elements = t.getElements();
      if (elements != tc.spec.num_elements())
        in.fail("tensor '" + tc.spec.name + "' has a size that does not match its shape");
      if (t.getNumSlots() > 8)
        in.fail("tensor '" + tc.spec.name + "' claims " + std::to_string(t.getNumSlots()) +
                " slots");
      in.record(tc.values, "tensor values");
      if (tc.values.size() != elements)
        in.fail("tensor '" + tc.spec.name + "' has the wrong number of values");
      tc.slots.resize(t.getNumSlots());
      for (auto& s : tc.slots) {
        in.record(s, "optimizer slots");
        if (s.size() != elements) in.fail("a slot of '" + tc.spec.name + "' has the wrong size");
      }
      c.tensors.push_back(std::move(tc));
    }
    const uint64_t tables = h.getTableCount();
    for (uint64_t i = 0; i < tables; ++i) {
      if (in.at_end())
        in.fail("truncated: " + std::to_string(i) + " of " + std::to_string(tables) + " tables");
      MessageRecord th;
      th.read(in, "a table header");
      auto t = th.reader->getRoot<ckpt::TableHeader>();
      TableCheckpoint tc;
      ShardTableSpec placed = from_wire(t.getSpec());
      tc.spec = placed.spec;
      tc.shard_index = placed.shard_index;
      tc.num_shards = placed.num_shards;
      tc.version = t.getVersion();
      if (t.getNumSlots() > 4)
        in.fail("table '" + tc.spec.name + "' claims " + std::to_string(t.getNumSlots()) +
                " slots");
      in.record(tc.ids, "table ids");
      if (tc.ids.size() != t.getRows())
        in.fail("table '" + tc.spec.name + "' has the wrong number of ids");
      const uint64_t floats = tc.ids.size() * uint64_t(tc.spec.dim);
      in.record(tc.values, "table rows");
      if (tc.values.size() != floats)
        in.fail("table '" + tc.spec.name + "' has the wrong number of values");
      tc.slots.resize(t.getNumSlots());
      for (auto& s : tc.slots) {
        in.record(s, "table slots");
        if (s.size() != floats)
          in.fail("a slot of table '" + tc.spec.name + "' has the wrong size");
      }
      if (t.getAges()) {
        in.record(tc.ages, "table row ages");
        if (tc.ages.size() != tc.ids.size())
          in.fail("table '" + tc.spec.name + "' has the wrong number of row ages");
      }
      tc.sketch_key = t.getSketchKey();
      tc.sketch_width = t.getSketchWidth();
      if (tc.sketch_width != 0) {
        if (tc.sketch_width > kMaxSketchWidth)
          in.fail("table '" + tc.spec.name + "' claims a count sketch of width " +
                  std::to_string(tc.sketch_width));
        in.record(tc.sketch, "a count sketch");
        if (tc.sketch.size() != std::size_t{kSketchRows} * tc.sketch_width)
          in.fail("table '" + tc.spec.name + "' has a count sketch of the wrong size");
      }
      c.tables.push_back(std::move(tc));
    }
    MessageRecord foot;
    if (in.at_end()) in.fail("truncated before the footer");
    foot.read(in, "the footer");
    if (foot.reader->getRoot<ckpt::Footer>().getTensorCount() != count ||
        foot.reader->getRoot<ckpt::Footer>().getTableCount() != tables) {
      in.fail("footer and header disagree");
    }
    if (!in.at_end()) in.fail("trailing bytes after the footer");
  } catch (const kj::Exception& e) {
    in.fail(std::string("malformed record: ") + e.getDescription().cStr());
  } catch (const RequestError& e) {
    in.fail(std::string("bad content: ") + e.what());
  }
  return c;
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir, uint32_t shard_index,
                                             uint32_t num_shards) {
  std::vector<CheckpointFile> out;
  const std::string sdir = shard_checkpoint_dir(dir, shard_index, num_shards);
  for (const auto& name : dir_entries(sdir)) {
    int64_t step = 0;
    if (parse_step(name, &step)) out.push_back({sdir + "/" + name, shard_index, num_shards, step});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

std::vector<CheckpointFile> list_all_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> out;
  for (const auto& name : dir_entries(dir)) {
    uint32_t index = 0, count = 0;
    if (!parse_shard_dir(name, &index, &count)) continue;
    auto files = list_checkpoints(dir, index, count);
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

void prune_checkpoints(const std::string& dir, uint32_t shard_index, uint32_t num_shards,
                       uint32_t keep, int64_t written) {
  std::size_t kept = 0;
  for (const auto& file : list_checkpoints(dir, shard_index, num_shards)) {  // newest first
    if (file.step > written) continue;
    if (kept++ >= std::max<uint32_t>(keep, 1)) ::unlink(file.path.c_str());
  }
  const std::string sdir = shard_checkpoint_dir(dir, shard_index, num_shards);
  for (const auto& name : dir_entries(sdir)) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
      ::unlink((sdir + "/" + name).c_str());
  }
}

}  // namespace ps
