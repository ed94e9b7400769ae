// The Criteo TSV layout: parsing, formatting; a line reader of either layout.
#include "ps/ctr_data.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "client/trainer/ctr_text.h"
#include "ps/errors.h"

namespace ps {
namespace {

constexpr int kFields = 1 + kCtrDense + kCtrCategorical;

using detail::shown;

}  // namespace

bool parse_ctr_line(std::string_view line, CtrExample& out, std::string* error) {
  const auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return false;
  };
  line = detail::without_cr(line);
  std::array<std::string_view, kFields> f;
  int n = 0;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    const std::string_view field =
        line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
    if (n < kFields) f[n] = field;
    ++n;
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  if (n != kFields)
    return fail(
        fmt::format("expected {} tab-separated fields (label, 13 integers, 26 categorical), got {}",
                    kFields, n));

  if (f[0] == "0" || f[0] == "1")
    out.label = f[0] == "1" ? 1.0f : 0.0f;
  else
    return fail(fmt::format("label: expected 0 or 1, got {}", shown(f[0])));

  for (int j = 0; j < kCtrDense; ++j) {
    const std::string_view s = f[1 + j];
    out.dense[j] = 0;
    out.dense_present[j] = !s.empty();
    if (s.empty()) continue;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out.dense[j], 10);
    if (ec != std::errc() || end != s.data() + s.size())
      return fail(fmt::format("I{}: not a 64-bit integer: {}", j + 1, shown(s)));
  }
  for (int j = 0; j < kCtrCategorical; ++j) {
    const std::string_view s = f[1 + kCtrDense + j];
    out.categorical[j] = 0;
    out.categorical_present[j] = !s.empty();
    if (s.empty()) continue;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out.categorical[j], 16);
    if (s.size() > 8 || ec != std::errc() || end != s.data() + s.size())
      return fail(fmt::format("C{}: not a hex value of up to 8 digits: {}", j + 1, shown(s)));
  }
  return true;
}

std::string format_ctr_line(const CtrExample& e) {
  fmt::memory_buffer b;
  fmt::format_to(std::back_inserter(b), "{}", e.label > 0.5f ? 1 : 0);
  for (int j = 0; j < kCtrDense; ++j) {
    b.push_back('\t');
    if (e.dense_present[j]) fmt::format_to(std::back_inserter(b), "{}", e.dense[j]);
  }
  for (int j = 0; j < kCtrCategorical; ++j) {
    b.push_back('\t');
    if (e.categorical_present[j]) fmt::format_to(std::back_inserter(b), "{:08x}", e.categorical[j]);
  }
  return fmt::to_string(b);
}

void CtrReader::GzClose::operator()(gzFile_s* f) const { gzclose(f); }

CtrReader::CtrReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: a directory, not a CTR data file", path));
  in_.reset(gzopen(path.c_str(), "rb"));
  if (!in_)
    throw ConfigError(fmt::format(
        "{}: cannot open CTR data file (scripts/make_ctr_data.sh writes one; or --synthetic N)",
        path));
  gzbuffer(in_.get(), 1 << 18);
  buf_.resize(1 << 18);
  const auto size = std::filesystem::file_size(path, ec);
  file_bytes_ = ec ? 0 : size;
  // A tar archive (Criteo's dac.tar.gz as downloaded): its training member is
  // read. Otherwise the first block is the data's start.
  std::array<char, 512> block{};
  const std::size_t got = read_data(block.data(), block.size(), true);
  if (got == block.size() && std::memcmp(block.data() + 257, "ustar", 5) == 0) {
    open_tar_member(block);
  } else {
    std::memcpy(buf_.data(), block.data(), got);
    buf_end_ = got;
  }
}

namespace {

// A tar header's number field: octal text, or base-256 (GNU, for members of
// 8 GiB and more: Criteo's train.txt is 11 GB) when its first byte has the high bit.
uint64_t tar_number(const char* field, std::size_t size) {
  uint64_t v = 0;
  if (static_cast<unsigned char>(field[0]) & 0x80) {
    for (std::size_t i = 1; i < size; ++i) v = (v << 8) | static_cast<unsigned char>(field[i]);
    return v;
  }
  for (std::size_t i = 0; i < size && field[i] != '\0'; ++i)
    if (field[i] >= '0' && field[i] <= '7') v = v * 8 + static_cast<uint64_t>(field[i] - '0');
  return v;
}

std::string tar_text(const char* field, std::size_t size) {
  return std::string(field, strnlen(field, size));
}

}  // namespace

void CtrReader::open_tar_member(std::array<char, 512>& block) {
  std::vector<std::string> others;
  while (true) {
    if (std::all_of(block.begin(), block.end(), [](char c) { return c == '\0'; })) {
      throw ConfigError(fmt::format(
          "{}: a tar archive without a train.txt, train.csv or train.tsv in it (it holds: {})",
          path_, fmt::join(others, ", ")));
    }
    const std::string prefix = tar_text(block.data() + 345, 155);
    const std::string name = (prefix.empty() ? "" : prefix + "/") + tar_text(block.data(), 100);
    const uint64_t size = tar_number(block.data() + 124, 12);
    const char type = block[156];
    const std::string base = name.substr(name.rfind('/') + 1);
    if ((type == '0' || type == '\0') &&
        (base == "train.txt" || base == "train.csv" || base == "train.tsv")) {
      member_left_ = size;
      in_tar_ = true;
      return;
    }
    if (type == '0' || type == '\0') others.push_back(name);
    // Past the member's data, in whole blocks, to the next header.
    for (uint64_t skip = (size + 511) / 512 * 512; skip > 0;) {
      const std::size_t n = read_data(buf_.data(), std::min<uint64_t>(skip, buf_.size()), true);
      if (n == 0)
        throw ConfigError(fmt::format("{}: the tar archive ends inside '{}'", path_, name));
      skip -= n;
    }
    if (read_data(block.data(), block.size(), true) != block.size())
      throw ConfigError(fmt::format("{}: the tar archive ends without its end blocks", path_));
  }
}

std::size_t CtrReader::read_data(char* to, std::size_t n, bool exact) {
  if (in_tar_) n = static_cast<std::size_t>(std::min<uint64_t>(n, member_left_));
  std::size_t done = 0;
  while (done < n) {
    const int got = gzread(in_.get(), to + done, static_cast<unsigned>(n - done));
    if (got <= 0) {
      int err = Z_OK;
      std::string_view why = gzerror(in_.get(), &err);
      if (err != Z_OK && err != Z_STREAM_END) {
        if (why.starts_with(path_ + ": "))
          why.remove_prefix(path_.size() + 2);  // zlib names the file
        throw ConfigError(
            fmt::format("{}:{}: read error: {}", path_, line_number_ + 1,
                        err == Z_ERRNO ? std::string_view(std::strerror(errno)) : why));
      }
      if (in_tar_ && member_left_ > done)
        throw ConfigError(
            fmt::format("{}:{}: the tar archive ends inside its member", path_, line_number_ + 1));
      break;
    }
    done += static_cast<std::size_t>(got);
    if (!exact) break;
  }
  if (in_tar_) member_left_ -= done;
  return done;
}

bool CtrReader::read_line() {
  constexpr std::size_t kMaxLine = std::size_t{1} << 20;
  line_.clear();
  while (true) {
    if (buf_at_ == buf_end_) {
      const std::size_t n = read_data(buf_.data(), buf_.size(), false);
      if (n == 0) {
        if (line_.empty()) return false;
        break;  // a last line without its '\n'
      }
      buf_at_ = 0;
      buf_end_ = n;
    }
    const char* at = buf_.data() + buf_at_;
    const auto* nl = static_cast<const char*>(std::memchr(at, '\n', buf_end_ - buf_at_));
    const std::size_t take = nl ? static_cast<std::size_t>(nl - at) : buf_end_ - buf_at_;
    line_.append(at, take);
    buf_at_ += take + (nl ? 1 : 0);
    if (line_.size() > kMaxLine) {
      throw ConfigError(fmt::format("{}:{}: a line of more than 1 MiB: not click data?", path_,
                                    line_number_ + 1));
    }
    if (nl) break;
  }
  if (line_.find('\0') != std::string::npos)
    throw ConfigError(fmt::format("{}:{}: a NUL byte: not click data?", path_, line_number_ + 1));
  return true;
}

bool CtrReader::next_line() {
  while (read_line()) {
    ++line_number_;
    if (line_.empty() || line_ == "\r") continue;
    if (!started_) {
      started_ = true;
      if (line_.starts_with("\xEF\xBB\xBF")) line_.erase(0, 3);  // a UTF-8 byte order mark
      // A first line with commas and no tab is a CSV's header.
      if (line_.find('\t') == std::string::npos && line_.find(',') != std::string::npos) {
        try {
          csv_ = CtrCsvLayout::from_header(line_);
        } catch (const ConfigError& e) {
          throw ConfigError(fmt::format("{}:{}: {}", path_, line_number_, e.what()));
        }
        header_ = line_;
        continue;
      }
    }
    if (!header_.empty() && line_ == header_) continue;  // the header again: files joined by cat
    return true;
  }
  return false;
}

bool CtrReader::next(CtrExample& out) {
  if (!next_line()) return false;
  std::string why;
  if (!(is_csv() ? csv_.parse(line_, out, &why) : parse_ctr_line(line_, out, &why)))
    throw ConfigError(fmt::format("{}:{}: {}", path_, line_number_, why));
  return true;
}

bool CtrReader::skip() { return next_line(); }

uint64_t CtrReader::bytes_read() const {
  const auto at = gzoffset(in_.get());
  return at < 0 ? file_bytes_ : std::min(file_bytes_, static_cast<uint64_t>(at));
}

void check_ctr_examples_fit(int64_t examples, std::size_t extra_bytes_each,
                            const std::string& what) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0 || examples <= 0) return;
  const double need =
      static_cast<double>(examples) * static_cast<double>(sizeof(CtrExample) + extra_bytes_each);
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need > have) {
    throw ConfigError(
        fmt::format("{}: {} examples need {:.1f} GB in memory, more than this "
                    "machine's {:.1f} GB",
                    what, examples, need / 1e9, have / 1e9));
  }
}

std::vector<CtrExample> read_ctr_file(const std::string& path, int64_t max_examples) {
  CtrReader reader(path);
  std::vector<CtrExample> all;
  CtrExample e;
  while ((max_examples < 0 || static_cast<int64_t>(all.size()) < max_examples) && reader.next(e))
    all.push_back(e);
  return all;
}

}  // namespace ps
