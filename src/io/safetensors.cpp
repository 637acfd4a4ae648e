#include "io/safetensors.h"

#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
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

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Element count of a shape, or false if it overflows 64 bits.
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

// One header entry before its bytes are read.
struct Entry {
  NamedTensor tensor;
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
  } else {
    throw bad(fmt::format("has dtype {}, which is not supported (supported: F32, BF16)", dtype));
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

// Reads exactly n bytes or throws.
void read_exact(std::FILE* f, void* buf, size_t n, const std::string& path) {
  if (n == 0) return;
  if (std::fread(buf, 1, n, f) != n) {
    if (std::ferror(f)) throw IoError(fmt::format("{}: read failed ({})", path, std::strerror(errno)));
    throw IoError(fmt::format("{}: file ended early (was it changed while being read?)", path));
  }
}

void read_tensor_data(std::FILE* f, const std::string& path, NamedTensor& t, uint64_t bytes) {
  const size_t numel = bytes / dtype_size(t.dtype);
  t.data.resize(numel);
  if (t.dtype == DType::F32) {
    read_exact(f, t.data.data(), bytes, path);
    return;
  }
  std::vector<uint16_t> raw(numel);
  read_exact(f, raw.data(), bytes, path);
  std::transform(raw.begin(), raw.end(), t.data.begin(), bf16_to_float);
}

}  // namespace

const NamedTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsFile load_safetensors(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw IoError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw IoError(fmt::format("{}: not a regular file", path));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    throw IoError(fmt::format("{}: file is {} bytes, too short for the 8-byte header length",
                              path, file_bytes));
  }
  uint64_t header_len = 0;
  read_exact(f.get(), &header_len, 8, path);
  if (header_len > kMaxHeaderBytes) {
    throw IoError(fmt::format("{}: header length {} exceeds the 100 MB limit", path, header_len));
  }
  if (header_len > file_bytes - 8) {
    throw IoError(fmt::format("{}: header length {} runs past the end of the {}-byte file", path,
                              header_len, file_bytes));
  }
  std::string header(header_len, '\0');
  read_exact(f.get(), header.data(), header_len, path);

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    throw IoError(fmt::format("{}: header is not valid JSON (byte {})", path, e.byte));
  }
  if (!j.is_object()) throw IoError(fmt::format("{}: header is not a JSON object", path));

  const uint64_t data_bytes = file_bytes - 8 - header_len;
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : j.items()) {
    if (key != "__metadata__") {
      entries.push_back(parse_entry(path, key, value, data_bytes));
      continue;
    }
    if (!value.is_object()) throw IoError(fmt::format("{}: __metadata__ is not a JSON object", path));
    for (const auto& [mk, mv] : value.items()) {
      if (!mv.is_string()) {
        throw IoError(fmt::format("{}: metadata value for '{}' is not a string", path, mk));
      }
      out.metadata[mk] = mv.get<std::string>();
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
                                path, e.tensor.name, e.begin, e.end));
    }
    if (e.begin > pos) {
      throw IoError(fmt::format("{}: tensor '{}' data [{}, {}] leaves a gap after byte {}", path,
                                e.tensor.name, e.begin, e.end, pos));
    }
    pos = e.end;
  }
  if (pos != data_bytes) {
    throw IoError(fmt::format("{}: tensors cover {} bytes of data but the file holds {}", path,
                              pos, data_bytes));
  }

  for (auto& e : entries) {
    read_tensor_data(f.get(), path, e.tensor, e.end - e.begin);
    out.tensors.push_back(std::move(e.tensor));
  }
  return out;
}

namespace {

// Compact JSON, tensors in the caller's order, padded with spaces to a
// multiple of 8 so the data that follows is 8-byte aligned (as the reference
// library writes it).
std::string make_header(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      throw InputError(fmt::format("{}: tensor name '{}' is empty, reserved or repeated", path,
                                   t.name));
    }
    uint64_t numel = 0;
    if (!checked_numel(t.shape, &numel) || numel != t.data.size()) {
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but {} values", path, t.name,
                                   shape_str(t.shape), t.data.size()));
    }
    const uint64_t end = offset + numel * dtype_size(t.dtype);
    j[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
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

void write_tensor(AtomicFile& f, const NamedTensor& t) {
  if (t.dtype == DType::F32) return f.write(t.data.data(), t.data.size() * sizeof(float));
  std::vector<uint16_t> raw(t.data.size());
  std::transform(t.data.begin(), t.data.end(), raw.begin(), float_to_bf16);
  f.write(raw.data(), raw.size() * sizeof(uint16_t));
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string header = make_header(path, tensors, metadata);
  AtomicFile f(path);  // temporary name, fsync, rename: never half-written
  const uint64_t header_len = header.size();
  f.write(&header_len, 8);
  f.write(header);
  for (const NamedTensor& t : tensors) write_tensor(f, t);
  f.commit();
}

}  // namespace dpt
