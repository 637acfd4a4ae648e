#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dpt {

// Tensor bytes are copied straight to and from float memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

// The reference library refuses headers above 100 MB; so do we, which also
// bounds what a corrupt length field can make us allocate.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// BF16 values are converted through a buffer of this many elements, so
// streaming a huge tensor never allocates a copy of it.
constexpr size_t kBf16Block = 1 << 16;

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Element count of a shape, or false if it is negative or overflows 64 bits.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* numel) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *numel = n;
  return true;
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even, as PyTorch does; NaN stays a (quiet) NaN.
uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half precision: 1 sign bit, 5 exponent bits (bias 15), 10 fraction
// bits. Every half is exactly a float.
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (frac << 13));  // infinity, NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (frac << 13));
  const float v = std::ldexp(static_cast<float>(frac), -24);  // zero or subnormal: frac x 2^-24
  return sign ? -v : v;
}

// Round to nearest even, as PyTorch does; past the largest half (65504,
// from 65520 up) an infinity, which the writer refuses before it gets here.
uint16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f), a = u & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u;    // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;   // rounds to 65536 or more
  if (a < 0x38800000u)  // below 2^-14: a subnormal half, round(|f| x 2^24) (exact scaling, then rint)
    return sign | static_cast<uint16_t>(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f));
  uint32_t r = a - (112u << 23);  // the exponent rebiased from 127 to 15
  r += 0xfffu + ((r >> 13) & 1);
  return sign | static_cast<uint16_t>(r >> 13);
}

// A 16-bit file type's conversions.
using Narrow = uint16_t (*)(float);
using Widen = float (*)(uint16_t);
Narrow narrowing(DType t) { return t == DType::BF16 ? float_to_bf16 : float_to_f16; }
Widen widening(DType t) { return t == DType::BF16 ? bf16_to_float : f16_to_float; }

// Where F16 ends: from here on a value rounds to infinity (65504 is the
// largest half; values up to this bound round down to it).
constexpr float kF16Overflow = 65520.0f;

// ---- The header on disk ----

// Compact JSON, tensors in the caller's order, padded with spaces to a
// multiple of 8 so the data that follows is 8-byte aligned (as the reference
// library writes it). Sets numels[i] to the element count of tensors[i].
std::string make_header(const std::string& path, const std::vector<TensorSpec>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        std::vector<uint64_t>* numels) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      throw InputError(fmt::format("{}: tensor name '{}' is empty, reserved or repeated", path,
                                   t.name));
    }
    uint64_t numel = 0, bytes = 0, end = 0;
    if (!checked_numel(t.shape, &numel) ||
        __builtin_mul_overflow(numel, dtype_size(t.dtype), &bytes) ||
        __builtin_add_overflow(offset, bytes, &end)) {
      throw InputError(fmt::format("{}: tensor '{}' has shape {}, which is negative or too large",
                                   path, t.name, shape_str(t.shape)));
    }
    j[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    numels->push_back(numel);
    offset = end;
  }
  std::string header;
  try {
    header = j.dump();
  } catch (const nlohmann::json::type_error&) {
    throw InputError(fmt::format("{}: a tensor name or metadata string is not valid UTF-8", path));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// One header entry: a tensor and its byte range within the data.
struct Entry {
  TensorSpec tensor;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j,
                  uint64_t data_bytes) {
  auto bad = [&](const std::string& what) {
    return IoError(fmt::format("{}: tensor '{}' {}", path, name, what));
  };
  if (!j.is_object()) throw bad("has a header entry that is not a JSON object");
  auto dt = j.find("dtype");
  auto sh = j.find("shape");
  auto off = j.find("data_offsets");
  if (dt == j.end() || !dt->is_string()) throw bad("has no string field 'dtype'");
  if (sh == j.end() || !sh->is_array()) throw bad("has no array field 'shape'");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    throw bad("has no field 'data_offsets' holding two non-negative integers");
  }
  Entry e;
  e.tensor.name = name;
  const std::string dtype = dt->get<std::string>();
  if (dtype == "F32") {
    e.tensor.dtype = DType::F32;
  } else if (dtype == "BF16") {
    e.tensor.dtype = DType::BF16;
  } else if (dtype == "F16") {
    e.tensor.dtype = DType::F16;
  } else {
    throw bad(fmt::format("has dtype {}, which is not supported (supported: F32, BF16, F16)", dtype));
  }
  for (const auto& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      throw bad("has a shape entry that is not a non-negative integer");
    }
    e.tensor.shape.push_back(d.get<int64_t>());
  }
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end) {
    throw bad(fmt::format("has data_offsets [{}, {}] that end before they begin", e.begin, e.end));
  }
  if (e.end > data_bytes) {
    throw bad(fmt::format("has data_offsets [{}, {}] past the end of the {} bytes of data",
                          e.begin, e.end, data_bytes));
  }
  uint64_t numel = 0;
  if (!checked_numel(e.tensor.shape, &numel)) {
    throw bad(fmt::format("has shape {}, whose element count overflows", shape_str(e.tensor.shape)));
  }
  // numel is compared before multiplying so a huge shape cannot wrap around.
  const size_t esize = dtype_size(e.tensor.dtype);
  if (numel > data_bytes / esize || numel * esize != e.end - e.begin) {
    throw bad(fmt::format("has shape {} ({} elements) but {} bytes of {} data",
                          shape_str(e.tensor.shape), numel, e.end - e.begin, dtype));
  }
  return e;
}

// Reads exactly n bytes at offset or throws. pread leaves no shared file
// position, so concurrent reads of one file need no lock.
void pread_exact(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw IoError(fmt::format("{}: read failed ({})", path, std::strerror(errno)));
    if (got == 0) {
      throw IoError(fmt::format("{}: file ended early (was it changed while being read?)", path));
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// A byte as an error shows it: 'r' (0x72), or 0x00 when not printable.
std::string byte_str(unsigned char b) {
  return b >= 0x20 && b < 0x7f ? fmt::format("'{}' (0x{:02x})", static_cast<char>(b), b) : fmt::format("0x{:02x}", b);
}

// The header's length, after the checks that tell a safetensors file from
// any other file: 8 bytes of length, a length that fits the file, and '{'
// opening the JSON header (the format requires it). A file failing them is
// "not a safetensors file", with each check it failed.
uint64_t header_length(int fd, const std::string& path, uint64_t file_bytes) {
  if (file_bytes < 8)
    throw IoError(fmt::format("{}: not a safetensors file (it is {} bytes, too short for the 8-byte header length)",
                              path, file_bytes));
  uint64_t len = 0;
  pread_exact(fd, &len, 8, 0, path);
  std::vector<std::string> failed;
  if (len > file_bytes - 8)
    failed.push_back(fmt::format("its first 8 bytes give a header length of {}, which {} the end of the {}-byte file",
                                 len, len > kMaxHeaderBytes ? "exceeds the 100 MB limit and runs past" : "runs past",
                                 file_bytes));
  unsigned char first = '{';
  if (len > 0 && file_bytes > 8) pread_exact(fd, &first, 1, 8, path);
  if (first != '{')
    failed.push_back(fmt::format("its header is not a JSON object: byte 8 is {}, where '{{' must open it",
                                 byte_str(first)));
  if (!failed.empty())
    throw IoError(fmt::format("{}: not a safetensors file ({})", path, fmt::join(failed, "; ")));
  if (len > kMaxHeaderBytes) throw IoError(fmt::format("{}: header length {} exceeds the 100 MB limit", path, len));
  return len;
}

}  // namespace

uint64_t TensorSpec::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// ---- SafetensorsWriter ----

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  // Validate before creating anything, so bad input leaves no file behind.
  const std::string header = make_header(path_, tensors_, metadata, &numels_);
  for (uint64_t n : numels_) expected_ += n;
  file_.emplace(path_);  // temporary name, fsync, rename: never half-written
  const uint64_t header_len = header.size();
  file_->write(&header_len, 8);
  file_->write(header);
}

void SafetensorsWriter::write(const float* values, size_t n) {
  DPT_CHECK(file_, "{}: write() after commit()", path_);
  // Values past the promised total are counted, not written: commit() reports
  // them, since the header cannot change any more.
  received_ += n;
  while (n > 0 && current_ < tensors_.size()) {
    const uint64_t k = std::min<uint64_t>(n, numels_[current_] - done_);
    const DType dtype = tensors_[current_].dtype;
    if (dtype == DType::F32) {
      file_->write(values, k * sizeof(float));
    } else {
      if (dtype == DType::F16) check_f16_range(values, k);
      std::vector<uint16_t> raw(std::min<uint64_t>(k, kBf16Block));
      for (uint64_t i = 0; i < k; i += raw.size()) {
        const size_t m = std::min<uint64_t>(raw.size(), k - i);
        std::transform(values + i, values + i + m, raw.begin(), narrowing(dtype));
        file_->write(raw.data(), m * sizeof(uint16_t));
      }
    }
    values += k;
    n -= k;
    done_ += k;
    if (done_ == numels_[current_]) {  // also steps over zero-element tensors
      ++current_;
      done_ = 0;
    }
  }
}

void SafetensorsWriter::check_f16_range(const float* values, uint64_t k) {
  for (uint64_t i = 0; i < k; ++i)
    if (!(std::fabs(values[i]) < kF16Overflow)) {
      const TensorSpec& t = tensors_[current_];
      throw InputError(fmt::format("{}: tensor '{}' holds {} at element {}, beyond F16's largest value 65504: "
                                   "write it as F32 or BF16",
                                   path_, t.name, values[i], done_ + i));
    }
}

void SafetensorsWriter::seal() {
  DPT_CHECK(file_, "{}: seal() or commit() after commit()", path_);
  if (sealed_) return;
  if (received_ != expected_) {
    file_.reset();  // removes the temporary
    throw IoError(fmt::format("{}: {} values were written but the header promises {}", path_,
                              received_, expected_));
  }
  try {
    file_->seal();  // on failure it has already removed the temporary
  } catch (...) {
    file_.reset();
    throw;
  }
  sealed_ = true;
}

void SafetensorsWriter::commit() {
  seal();
  try {
    file_->commit();  // on failure it has already removed the temporary
  } catch (...) {
    file_.reset();
    throw;
  }
  file_.reset();
}

// ---- SafetensorsReader ----

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError(fmt::format("{}: cannot open ({})", path_, std::strerror(errno)));
  try {
    parse_header();
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a throwing constructor
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

void SafetensorsReader::parse_header() {
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw IoError(fmt::format("{}: not a regular file", path_));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  const uint64_t header_len = header_length(fd_, path_, file_bytes);
  std::string header(header_len, '\0');
  pread_exact(fd_, header.data(), header_len, 8, path_);

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    throw IoError(fmt::format("{}: header is not valid JSON (byte {})", path_, e.byte));
  }
  if (!j.is_object()) throw IoError(fmt::format("{}: header is not a JSON object", path_));

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = file_bytes - data_start;
  std::vector<Entry> entries;
  for (const auto& [key, value] : j.items()) {
    if (key != "__metadata__") {
      entries.push_back(parse_entry(path_, key, value, data_bytes));
      continue;
    }
    if (!value.is_object()) throw IoError(fmt::format("{}: __metadata__ is not a JSON object", path_));
    for (const auto& [mk, mv] : value.items()) {
      if (!mv.is_string()) {
        throw IoError(fmt::format("{}: metadata value for '{}' is not a string", path_, mk));
      }
      metadata_[mk] = mv.get<std::string>();
    }
  }

  // Like the reference library, require the regions to tile the data exactly:
  // sorted by offset, each starts where the previous ended, the last ends at
  // the end of the file. Zero-length tensors sort before a neighbour at the
  // same offset, so they fit anywhere.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const auto& e : entries) {
    if (e.begin < pos) {
      throw IoError(fmt::format("{}: tensor '{}' data [{}, {}] overlaps the tensor before it",
                                path_, e.tensor.name, e.begin, e.end));
    }
    if (e.begin > pos) {
      throw IoError(fmt::format("{}: tensor '{}' data [{}, {}] leaves a gap after byte {}", path_,
                                e.tensor.name, e.begin, e.end, pos));
    }
    pos = e.end;
  }
  if (pos != data_bytes) {
    throw IoError(fmt::format("{}: tensors cover {} bytes of data but the file holds {}", path_,
                              pos, data_bytes));
  }

  for (auto& e : entries) {
    tensors_.push_back(std::move(e.tensor));
    offsets_.push_back(data_start + e.begin);
  }
}

const TensorSpec* SafetensorsReader::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void SafetensorsReader::read(const std::string& name, uint64_t begin, uint64_t n,
                             float* out) const {
  const TensorSpec* t = find(name);
  if (!t) throw InputError(fmt::format("{}: no tensor '{}'", path_, name));
  const uint64_t numel = t->numel();
  // Written so that begin + n cannot wrap around.
  if (begin > numel || n > numel - begin) {
    throw InputError(fmt::format(
        "{}: tensor '{}' has {} elements, so {} elements from element {} are out of range", path_,
        name, numel, n, begin));
  }
  const uint64_t offset = offsets_[static_cast<size_t>(t - tensors_.data())];
  if (t->dtype == DType::F32) {
    pread_exact(fd_, out, n * sizeof(float), offset + begin * sizeof(float), path_);
  } else {
    std::vector<uint16_t> raw(std::min<uint64_t>(n, kBf16Block));
    for (uint64_t i = 0; i < n; i += raw.size()) {
      const size_t m = std::min<uint64_t>(raw.size(), n - i);
      pread_exact(fd_, raw.data(), m * sizeof(uint16_t), offset + (begin + i) * sizeof(uint16_t), path_);
      std::transform(raw.begin(), raw.begin() + m, out + i, widening(t->dtype));
    }
  }
  // Weights and optimizer state are finite; NaN or infinity in a file means
  // a diverged run was saved or the file is damaged.
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      throw IoError(fmt::format("{}: tensor '{}' holds {} at element {}: values must be finite", path_, name, out[i],
                                begin + i));
}

// ---- Whole files ----

const NamedTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (const TensorSpec& s : reader.tensors()) {
    NamedTensor t{s.name, s.dtype, s.shape, std::vector<float>(s.numel())};
    reader.read(s.name, 0, t.data.size(), t.data.data());
    out.tensors.push_back(std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const NamedTensor& t : tensors) {
    uint64_t numel = 0;
    if (!checked_numel(t.shape, &numel) || numel != t.data.size()) {
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but {} values", path, t.name,
                                   shape_str(t.shape), t.data.size()));
    }
    specs.push_back({t.name, t.dtype, t.shape});
  }
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const NamedTensor& t : tensors) writer.write(t.data.data(), t.data.size());
  writer.commit();
}

}  // namespace dpt
