// SummaryWriter: hand-encoded protobuf Events in TFRecord framing.
#include "ps/summary_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/utf8_text.h"
#include "ps/errors.h"

namespace ps {
namespace {

constexpr size_t kFlushBytes = 64 * 1024;
constexpr auto kFlushInterval = std::chrono::seconds(10);

// --- the few protobuf encodings we need ---
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_tag(out, field, 1);  // 64-bit
  put_le(out, bits, 8);
}
void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_tag(out, field, 5);  // 32-bit
  put_le(out, bits, 4);
}
void put_int64(std::string& out, int field, int64_t v) {
  put_tag(out, field, 0);  // varint; negatives take 10 bytes, as protobuf does
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, int field, std::string_view v) {
  put_tag(out, field, 2);  // length-delimited
  put_varint(out, v.size());
  out.append(v);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

}  // namespace

SummaryWriter::SummaryWriter(std::string logdir) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) throw ConfigError("summary logdir '" + logdir + "': cannot create: " + ec.message());
  const double t = now_seconds();
  const std::string base = logdir + "/events.out.tfevents." +
                           std::to_string(static_cast<long long>(t)) + "." + hostname();
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(::getpid()) + "." + std::to_string(n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n > 100))
      throw ConfigError("summary file '" + path_ + "': cannot create: " + std::strerror(errno));
  }
  last_flush_ = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  event_.clear();
  put_double(event_, 1, t);
  put_bytes(event_, 3, "brain.Event:2");
  append_record(event_);
  flush_locked();  // TensorBoard sees the file at once
}

SummaryWriter::~SummaryWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "SummaryWriter: %s\n", e.what());
  }
  if (fd_ >= 0) ::close(fd_);
}

void SummaryWriter::add_scalar(std::string_view tag, float value, int64_t step) {
  const double t = now_seconds();
  std::lock_guard lock(mu_);
  value_.clear();
  // A tag is a protobuf string: TensorBoard's reader rejects the whole
  // record (and stops reading the file) on bad UTF-8.
  put_bytes(value_, 1, valid_utf8(tag, tag_));
  put_float(value_, 2, value);
  summary_.clear();
  put_bytes(summary_, 1, value_);
  event_.clear();
  put_double(event_, 1, t);
  put_int64(event_, 2, step);
  put_bytes(event_, 5, summary_);
  append_record(event_);
  if (buffer_.size() >= kFlushBytes ||
      std::chrono::steady_clock::now() - last_flush_ >= kFlushInterval)
    flush_locked();
}

void SummaryWriter::append_record(const std::string& event) {
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t(event.size()) >> (8 * i));
  buffer_.append(len, 8);
  put_le(buffer_, mask_crc(crc32c(len, 8)), 4);
  buffer_.append(event);
  put_le(buffer_, mask_crc(crc32c(event.data(), event.size())), 4);
}

void SummaryWriter::flush() {
  std::lock_guard lock(mu_);
  flush_locked();
}

void SummaryWriter::flush_locked() {
  size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      buffer_.erase(0, done);  // keep only what is still unwritten
      errno = err;
      throw Error("summary file '" + path_ + "': write failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
  buffer_.clear();
  last_flush_ = std::chrono::steady_clock::now();
}

}  // namespace ps
