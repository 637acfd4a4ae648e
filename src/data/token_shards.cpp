#include "data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "core/error.h"

namespace dpt {

// Tokens and header fields are little-endian in the file and read in place.
static_assert(std::endian::native == std::endian::little, "token shards are read as little-endian");

namespace fs = std::filesystem;

TokenFormat parse_token_format(const std::string& s) {
  if (s.empty() || s == "auto") return TokenFormat::Auto;
  if (s == "llmc") return TokenFormat::Llmc;
  if (s == "u16") return TokenFormat::U16;
  if (s == "bytes") return TokenFormat::Bytes;
  throw InputError(fmt::format("unknown data format '{}' (expected llmc, u16 or bytes)", s));
}

const char* format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::Llmc: return "llmc";
    case TokenFormat::U16: return "u16";
    case TokenFormat::Bytes: return "bytes";
    default: return "auto";
  }
}

std::vector<std::string> expand_data_path(const std::string& spec) {
  std::vector<std::string> files;
  if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i)
        if (fs::is_regular_file(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (files.empty()) throw IoError(fmt::format("{}: no file matches", spec));
  } else {
    std::error_code ec;
    const fs::file_status st = fs::status(spec, ec);
    if (ec || !fs::exists(st)) throw IoError(fmt::format("{}: no such file or directory", spec));
    if (fs::is_regular_file(st)) return {spec};
    if (!fs::is_directory(st)) throw IoError(fmt::format("{}: not a file or directory", spec));
    for (const auto& e : fs::directory_iterator(spec, ec))
      if (std::error_code t; e.is_regular_file(t)) files.push_back(e.path().string());
    if (ec) throw IoError(fmt::format("{}: cannot list directory ({})", spec, ec.message()));
    if (files.empty()) throw IoError(fmt::format("{}: no files in the directory", spec));
  }
  // Byte order of the paths, so the dataset's order is the same everywhere.
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

// Reads exactly n bytes at offset, or fewer at the end of the file.
size_t pread_full(int fd, void* buf, size_t n, size_t offset, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(fmt::format("{}: read failed at byte {} ({})", path, offset + got, std::strerror(errno)));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

int open_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  return fd;
}

// Closes a descriptor on every path out of a scope.
struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

bool starts_with_magic(const std::string& path) {
  Fd f{open_file(path)};
  int32_t magic = 0;
  return pread_full(f.fd, &magic, sizeof magic, 0, path) == sizeof magic &&
         (magic == kLlmcMagic || magic == kLlmc32Magic);
}

// Checks every token of [begin, begin + sizeof(T) * count) against the
// vocabulary, a bounded buffer at a time (never through the mapping: see the
// header).
template <class T>
void check_tokens(int fd, const std::string& path, size_t begin, int64_t count, int64_t vocab) {
  constexpr size_t kChunk = (size_t{1} << 20) / sizeof(T);  // 1 MiB
  std::vector<T> buf(kChunk);
  for (int64_t done = 0; done < count;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kChunk), count - done));
    const size_t offset = begin + sizeof(T) * static_cast<size_t>(done);
    if (pread_full(fd, buf.data(), sizeof(T) * n, offset, path) != sizeof(T) * n)
      throw IoError(fmt::format("{}: the file shrank while it was read (at byte {})", path, offset));
    T top = 0;  // the largest token: a loop the compiler vectorises
    for (size_t i = 0; i < n; ++i) top = std::max(top, buf[i]);
    if (static_cast<int64_t>(top) >= vocab) {
      const size_t i = static_cast<size_t>(
          std::find_if(buf.begin(), buf.begin() + static_cast<long>(n),
                       [vocab](T t) { return static_cast<int64_t>(t) >= vocab; }) -
          buf.begin());
      throw InputError(fmt::format("{}: token {} at byte {} is outside the vocabulary 0..{}", path, buf[i],
                                   offset + sizeof(T) * i, vocab - 1));
    }
    done += static_cast<int64_t>(n);
  }
}

// Reads and checks an llm.c header: the token count and width (2 or 4).
std::pair<int64_t, size_t> llmc_header(int fd, const std::string& path, size_t size) {
  int32_t header[256] = {};
  if (pread_full(fd, header, sizeof header, 0, path) != sizeof header)
    throw InputError(fmt::format("{}: {} bytes, shorter than llm.c's {}-byte header", path, size, kLlmcHeaderBytes));
  if (header[0] != kLlmcMagic && header[0] != kLlmc32Magic)
    throw InputError(fmt::format("{}: magic number {} at byte 0 is not llm.c's {} (or {} for uint32 tokens; raw "
                                 "uint16 tokens need --data-format u16)", path, header[0], kLlmcMagic, kLlmc32Magic));
  const bool wide = header[0] == kLlmc32Magic;
  const int32_t version = wide ? kLlmc32Version : kLlmcVersion;
  if (header[1] != version)
    throw InputError(fmt::format("{}: version {} at byte 4 is not {} ({} tokens)", path, header[1], version,
                                 wide ? "uint32" : "uint16"));
  if (header[2] < 0) throw InputError(fmt::format("{}: token count {} at byte 8 is negative", path, header[2]));
  const size_t width = wide ? 4 : 2;
  const size_t want = kLlmcHeaderBytes + width * static_cast<size_t>(header[2]);
  if (size != want)
    throw InputError(fmt::format("{}: {} bytes, but its header (byte 8) promises {} tokens, {} bytes", path, size,
                                 header[2], want));
  return {header[2], width};
}

}  // namespace

TokenFormat detect_format(const std::string& spec) {
  return starts_with_magic(expand_data_path(spec).front()) ? TokenFormat::Llmc : TokenFormat::Bytes;
}

TokenShards::TokenShards(const std::string& spec, TokenFormat format, int64_t vocab) {
  DPT_CHECK(format == TokenFormat::Llmc || format == TokenFormat::U16, "token shards read llmc or u16, not {}",
            format_name(format));
  for (const std::string& path : expand_data_path(spec)) {
    Fd f{open_file(path)};
    struct stat st{};
    if (::fstat(f.fd, &st) != 0) throw IoError(fmt::format("{}: cannot stat ({})", path, std::strerror(errno)));
    const size_t size = static_cast<size_t>(st.st_size);
    Shard s;
    s.path = path;
    s.bytes = size;
    size_t begin = 0;
    if (format == TokenFormat::Llmc) {
      std::tie(s.tokens, s.width) = llmc_header(f.fd, path, size);
      begin = kLlmcHeaderBytes;
    } else {
      if (size % 2 != 0)
        throw InputError(fmt::format("{}: {} bytes, an odd number, cannot be uint16 tokens (byte {} is left over)",
                                     path, size, size - 1));
      s.tokens = static_cast<int64_t>(size / 2);
    }
    if (s.width == 4)
      check_tokens<uint32_t>(f.fd, path, begin, s.tokens, vocab);
    else
      check_tokens<uint16_t>(f.fd, path, begin, s.tokens, vocab);
    if (size > 0) {
      void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (m == MAP_FAILED) throw IoError(fmt::format("{}: cannot map ({})", path, std::strerror(errno)));
      // Windows are read at random: read-ahead into the mapping would only
      // bring pages into this process that no window asks for.
      ::madvise(m, size, MADV_RANDOM);
      s.map = static_cast<const uint8_t*>(m);
      s.data = s.map + begin;
    }
    shards_.push_back(std::move(s));
  }
}

TokenShards::~TokenShards() {
  for (Shard& s : shards_)
    if (s.map) ::munmap(const_cast<uint8_t*>(s.map), s.bytes);
}

int64_t TokenShards::total_tokens() const {
  int64_t n = 0;
  for (const Shard& s : shards_) n += s.tokens;
  return n;
}

void TokenShards::read(size_t shard, int64_t first, int64_t n, int32_t* out) const {
  const Shard& s = shards_.at(shard);
  DPT_CHECK(first >= 0 && n >= 0 && first + n <= s.tokens, "tokens [{}, {}) outside {}'s {}", first, first + n,
            s.path, s.tokens);
  if (s.width == 4) {
    // Checked below the vocabulary when opened, so every token fits an int32.
    const auto* p = reinterpret_cast<const uint32_t*>(s.data) + first;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
  } else {
    const auto* p = reinterpret_cast<const uint16_t*>(s.data) + first;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  }
  // What this read may have mapped: every folio it touches, whole.
  const size_t mapped = (s.width * static_cast<size_t>(n) / kFolioBytes + 2) * kFolioBytes;
  if (copied_since_drop_.fetch_add(mapped) + mapped >= kDropBytes) drop_pages();
}

void TokenShards::drop_pages() const {
  // The pages leave this process's page tables (and its RSS) but stay in
  // the page cache, so a window read again costs a minor fault, not I/O.
  for (const Shard& s : shards_)
    if (s.map) ::madvise(const_cast<uint8_t*>(s.map), s.bytes, MADV_DONTNEED);
  copied_since_drop_.store(0);
}

}  // namespace dpt
