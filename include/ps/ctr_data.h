// Click-through data in the Criteo display-ads TSV layout, and the features
// a wide & deep trainer makes of it.
//
// One example a line, 40 fields separated by tabs:
//   label (0 or 1) \t I1 .. I13 (integers, may be negative) \t C1 .. C26 (hex, up to 8 digits)
// Any of I1..C26 may be empty (a missing value); the label may not. A '\r'
// before the '\n' is dropped. This is the layout of Criteo's train.txt (the
// Kaggle challenge) and day_N (the Terabyte set); their test.txt has no
// label column and is refused.
//
// A file whose first line is a comma-separated header is read as such a CSV
// (Avazu's train.csv: id,click,hour,C1,banner_pos,site_id,...): `click` is
// the label; `hour` (YYMMDDHH) gives two categorical fields, the hour of the
// day and the day of the week; `id` is skipped; every other column is a
// categorical field, in header order from C1, its value a fixed 32-bit hash
// of its text (CtrCsvLayout). No dense fields. A header without `click`
// (Avazu's test.csv) is refused. Either layout may be gzip-compressed.
//
// Features:
//   - every categorical field becomes one 64-bit id, ctr_feature_id(field,
//     value), a fixed hash of (field, value), missing values getting their
//     own id per field; the deep part looks these ids up in embedding tables
//     (one per field, or one shared: ids of different fields differ);
//   - the wide part adds ids of field crosses, ctr_cross_id(a, b, e);
//   - dense fields become sign(x) * log(1 + |x|), 0 when missing.
// The hashes are part of the contract: a table trained on them and saved in a
// checkpoint stays valid, so they never change.
//
// Example:
//
//   ps::CtrReader reader("data/ctr/train.tsv");       // throws ps::ConfigError if unreadable
//   ps::CtrExample e;
//   std::vector<uint64_t> ids(ps::kCtrCategorical);    // (26)
//   std::vector<float> dense(ps::kCtrDense);           // (13)
//   std::vector<uint64_t> wide;
//   const auto crosses = ps::default_ctr_crosses();
//   while (reader.next(e)) {                           // a bad line throws "file:line: why"
//     ps::ctr_categorical_ids(e, ids);
//     ps::ctr_dense_features(e, dense);
//     ps::ctr_wide_ids(e, crosses, wide);              // 26 single ids, then one per cross
//   }
//   // or a whole batch at once:
//   ps::CtrBatch batch;
//   ps::make_ctr_batch(examples, crosses, batch);       // labels (B), dense (B, 13), ids (B, 26),
//   ...
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct gzFile_s;  // zlib's

namespace ps {

constexpr int kCtrDense = 13;
constexpr int kCtrCategorical = 26;

struct CtrExample {
  float label = 0;                                      // 0 or 1
  std::array<int64_t, kCtrDense> dense{};               // I1..I13; 0 where missing
  std::array<uint32_t, kCtrCategorical> categorical{};  // C1..C26; 0 where missing
  std::bitset<kCtrDense> dense_present;
  std::bitset<kCtrCategorical> categorical_present;
};

// Parses one line (without its '\n'). On a malformed line returns false, sets
// *error to why (which field, what was there) and leaves `out` unspecified.
bool parse_ctr_line(std::string_view line, CtrExample& out, std::string* error);

// The line of an example (no '\n'): label, integers in decimal, categorical
// values as 8 lower-case hex digits, missing ones empty.
std::string format_ctr_line(const CtrExample& e);

// A CSV file's columns, from its header line (see the top of this file).
class CtrCsvLayout {
 public:
  // Throws ps::ConfigError naming what is wrong: no `click` column, a name
  // twice, more categorical columns than C1..C26 hold.
  static CtrCsvLayout from_header(std::string_view header);
  // Parses one data line, as parse_ctr_line does.
  bool parse(std::string_view line, CtrExample& out, std::string* error) const;
  int columns() const { return static_cast<int>(names_.size()); }
  // The categorical field (0..25) column c fills; -1 for click, id and hour.
  int field_of(int column) const { return field_[column]; }
  // The two fields `hour` fills (hour of day, then weekday); -1 without it.
  int hour_field() const { return hour_field_; }

 private:
  std::vector<std::string> names_;
  std::vector<int> field_;
  int label_ = -1, hour_ = -1, hour_field_ = -1;
};

// The text hash of a CSV categorical value (FNV-1a, 32 bits): fixed, as
// ctr_feature_id's.
uint32_t ctr_text_value(std::string_view text);

// Reads a file line by line, in either layout (the first non-empty line
// tells which), gzip-compressed or not (Criteo's day_N.gz, Avazu's train.gz
// as downloaded), or from a tar archive, compressed or not, its member named
// train.txt, train.csv or train.tsv (Criteo's dac.tar.gz). Empty lines, a UTF-8 byte order mark and
// a CSV's header (also where it repeats, as in files joined by cat) are skipped; a malformed line,
// one over 1 MiB or with a NUL byte (not click data), throws ps::ConfigError "path:line: why".
class CtrReader {
 public:
  explicit CtrReader(const std::string& path);  // throws ps::ConfigError if it cannot be opened
  bool next(CtrExample& out);                   // false at the end of the file
  // Moves past the next example without parsing it (false at the end of the
  // file): a worker skips the examples other workers read.
  bool skip();
  int64_t line_number() const { return line_number_; }  // of the last line read
  uint64_t bytes_read() const;  // of the file (compressed, if it is), so far
  uint64_t file_bytes() const { return file_bytes_; }
  bool is_csv() const { return csv_.columns() > 0; }

 private:
  bool next_line();  // the next non-empty line into line_; false at the end
  bool read_line();  // the next line into line_; false at the end
  // Up to n bytes of the data (a tar member's, in an archive): one read, or
  // with `exact` as many as there are up to n.
  std::size_t read_data(char* to, std::size_t n, bool exact);
  void open_tar_member(std::array<char, 512>& first_header);
  struct GzClose {
    void operator()(gzFile_s* f) const;
  };
  std::string path_;
  std::unique_ptr<gzFile_s, GzClose> in_;  // zlib reads plain files as they are
  std::vector<char> buf_;                  // what zlib gave, [buf_at_, buf_end_) not yet a line
  std::size_t buf_at_ = 0, buf_end_ = 0;
  bool in_tar_ = false;
  uint64_t member_left_ = 0;  // in_tar_: the member's bytes not yet read
  std::string header_;  // a CSV's header line
  std::string line_;
  int64_t line_number_ = 0;
  uint64_t file_bytes_ = 0;
  bool started_ = false;
  CtrCsvLayout csv_;
};

// Every example of a file (at most max_examples when >= 0).
std::vector<CtrExample> read_ctr_file(const std::string& path, int64_t max_examples = -1);

// Throws ps::ConfigError, naming `what` and both sizes, when `examples`
// CtrExamples, plus `extra_bytes_each` bytes apiece, need more memory than
// this machine has: refused at once rather than after minutes of work.
void check_ctr_examples_fit(int64_t examples, std::size_t extra_bytes_each,
                            const std::string& what);

// One worker's part of a training file, read in two passes: the count (where
// the held-out part starts; whether what is kept fits in memory, else
// ps::ConfigError), then the examples kept. The file's examples (empty lines and
// a header not counted) are training examples up to
// train_end = N - round(N * holdout) and held out after, as the trainers
// split them (and CtrSynthetic, so a generated file's planted figures are
// for the same held-out part). A file that ends before its count is refused. A worker keeps the
// training examples i with i % workers == worker, and the held-out ones if asked; the lines it does
// not keep are counted, not parsed (the worker that keeps one checks it), so
// each of W workers holds and parses about 1/W of the file.
// How many of `total` examples are worker's of `workers`: those i with
// i % workers == worker, as every reader and generator splits them.
constexpr int64_t ctr_share_size(int64_t total, int64_t worker, int64_t workers) {
  return total > worker ? (total - worker + workers - 1) / workers : 0;
}

struct CtrShareOptions {
  int worker = 0, workers = 1;
  double holdout = 0;         // [0, 1)
  bool keep_train = true;     // false: the held-out part alone
  bool keep_holdout = false;  // the chief's evaluation set
  int64_t max_examples = -1;  // >= 0: the file's first this many examples only
  // Called about every progress_seconds while reading (a large file takes
  // minutes): what is being done ("counting the examples in", "reading"),
  // bytes of the file done, its size.
  std::function<void(const std::string& doing, uint64_t done, uint64_t total)> progress;
  double progress_seconds = 5;
  // Appended to the refusal of a share larger than the machine's memory
  // (check_ctr_examples_fit): what the caller offers instead.
  std::string too_large_hint;
  // Bytes the caller will hold per example beside it (the check above).
  std::size_t extra_bytes_each = 0;
};
struct CtrShare {
  std::vector<CtrExample> train, holdout;
  int64_t examples = 0;   // N
  int64_t train_end = 0;  // training examples in the file, every worker's
};
CtrShare read_ctr_share(const std::string& path, const CtrShareOptions& options);

// A worker's training share of a file read batch by batch, for files larger
// than memory: the examples of read_ctr_share's `train`, in the same order,
// with only the batch in memory. At the end of the share a batch is cut
// short, and the next one starts over from the file's beginning.
//
//   ps::CtrShareOptions o{.worker = 1, .workers = 3, .holdout = 0.1, .keep_train = false};
//   const ps::CtrShare counted = ps::read_ctr_share(path, o);   // the count, no examples
//   ps::CtrShareStream stream(path, 1, 3, counted.train_end);
//   std::vector<ps::CtrExample> batch;
//   while (training) stream.next(512, batch);
class CtrShareStream {
 public:
  // train_end: the training examples in the file, every worker's.
  CtrShareStream(std::string path, int worker, int workers, int64_t train_end);
  // Replaces `out` with the next up to n examples of the share. After it
  // throws (a malformed line, a file that has shrunk), the next call starts
  // the share over. Not thread-safe.
  void next(std::size_t n, std::vector<CtrExample>& out);
  int64_t share_size() const { return share_size_; }

 private:
  void fill(std::size_t n, std::vector<CtrExample>& out);
  std::string path_;
  int worker_, workers_;
  int64_t train_end_, share_size_;
  std::optional<CtrReader> reader_;
  int64_t at_ = 0;  // the next example's index in the file
};

// --- features ---

// Id of categorical field `field` (0..25) of e; a missing value has its own id.
uint64_t ctr_feature_id(int field, const CtrExample& e);
// The same from a raw (field, value); value kCtrMissing stands for a missing one.
constexpr uint64_t kCtrMissing = uint64_t{1} << 32;
uint64_t ctr_hash_feature(int field, uint64_t value);
// Id of the cross of categorical fields a and b; differs from every single-field id.
uint64_t ctr_cross_id(int a, int b, const CtrExample& e);

struct FieldCross {
  int a = 0;  // categorical field indices, 0..25
  int b = 0;
};
// Crosses of neighbouring fields (C1 x C2, C3 x C4, ..., C25 x C26).
std::vector<FieldCross> default_ctr_crosses();

// ids (26) = ctr_feature_id(f, e) for every categorical field.
void ctr_categorical_ids(const CtrExample& e, std::span<uint64_t> ids);
// out (13) = sign(x) * log(1 + |x|) of each dense field, 0 where missing.
void ctr_dense_features(const CtrExample& e, std::span<float> out);
// ids = the 26 single-field ids, then one id per cross (replaces its contents).
void ctr_wide_ids(const CtrExample& e, std::span<const FieldCross> crosses,
                  std::vector<uint64_t>& ids);

// The features of B examples side by side, as a trainer's step takes them.
struct CtrBatch {
  int64_t size = 0;                // B
  std::vector<float> labels;       // (B)
  std::vector<float> dense;        // (B, 13) ctr_dense_features
  std::vector<uint64_t> ids;       // (B, 26) ctr_categorical_ids: the deep part's bags, one id each
  std::vector<uint64_t> wide_ids;  // (B, 26 + crosses) ctr_wide_ids
};
// Fills `batch` (buffers reused) from the examples.
void make_ctr_batch(std::span<const CtrExample> examples, std::span<const FieldCross> crosses,
                    CtrBatch& batch);

}  // namespace ps
