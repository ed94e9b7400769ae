// TensorBoard event files, written without TensorFlow or protobuf.
//
// Usage:
//   ps::SummaryWriter summaries(flags.logdir);   // creates the directory
//   summaries.add_scalar("loss", loss, step);
//   summaries.add_scalar("accuracy/validation", acc, step);
//   summaries.flush();                          // also done by add_scalar once
//                                               // 64 KiB or 10 s have gathered,
//                                               // and at exit (no timer: a
//                                               // writer that waits long
//                                               // between scalars flushes)
//   // tensorboard --logdir <log_dir>
//
// File: <logdir>/events.out.tfevents.<unix secs>.<hostname> (".<pid>.<n>"
// appended if that name is taken). Each record is
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// little-endian, masked crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8, where
// data is a serialized tensorflow.Event: the first carries
// file_version = "brain.Event:2", then one Event per scalar:
//   Event{wall_time=1 (double), step=2 (int64),
//         summary=5 {value=1 {tag=1 (string), simple_value=2 (float)}}}
// A tag that is not valid UTF-8 is written with U+FFFD for each bad byte
// (TensorBoard cannot read a file with such a tag). Thread-safe. I/O
// failures throw ps::Error; a logdir that cannot be created throws
// ps::ConfigError.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "ps/crc32c.h"

namespace ps {

class SummaryWriter {
 public:
  explicit SummaryWriter(std::string logdir);
  ~SummaryWriter();  // flushes; errors there are logged to stderr, not thrown
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  void add_scalar(std::string_view tag, float value, int64_t step);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void append_record(const std::string& event);  // lock held
  void flush_locked();

  std::string path_;
  int fd_ = -1;
  std::mutex mu_;
  std::string buffer_;   // framed records not yet written
  std::string event_;    // scratch for one Event, reused
  std::string value_;    // scratch for Summary.Value, reused
  std::string summary_;  // scratch for Summary, reused
  std::string tag_;      // scratch for a tag made valid UTF-8
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace ps
