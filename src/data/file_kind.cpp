#include "data/file_kind.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "data/byte_corpus.h"
#include "data/utf8.h"

namespace dpt {
namespace {

// "88 d8 34 01": bytes as a hex dump shows them.
std::string hex_bytes(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  }
  return out.empty() ? "none (the file is empty)" : out;
}

std::string magic_bytes(int32_t magic) { return hex_bytes(std::string(reinterpret_cast<const char*>(&magic), 4)); }

[[noreturn]] void refuse(const std::string& path, const std::string& head, size_t at, bool nul,
                         const FormatFlags& flags) {
  throw InputError(fmt::format(
      "{}: neither an llm.c shard nor text: its first four bytes are {} (llm.c's shards start with {} or {}) and "
      "byte {} is {}; raw uint16 tokens need {}, text read byte by byte needs {}",
      path, hex_bytes(head), magic_bytes(kLlmcMagic), magic_bytes(kLlmc32Magic), at,
      nul ? "a NUL" : "not valid UTF-8", flags.u16, flags.bytes));
}

// The first byte of `path` that is a NUL or starts invalid UTF-8; npos when
// the file is text. Sets head to its first four bytes.
size_t first_non_text(const std::string& path, std::string& head, bool& nul) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  constexpr size_t kChunk = size_t{1} << 20;
  std::string buf;  // bytes carried from the last chunk (an incomplete sequence), then the chunk
  std::vector<char> chunk(kChunk);
  size_t base = 0;  // file offset of buf[0]
  head.clear();
  for (bool end = false; !end;) {
    in.read(chunk.data(), static_cast<std::streamsize>(kChunk));
    const size_t got = static_cast<size_t>(in.gcount());
    if (in.bad()) throw IoError(fmt::format("{}: read failed at byte {}", path, base + buf.size()));
    end = got < kChunk;
    buf.append(chunk.data(), got);
    if (head.size() < 4) head = buf.substr(0, 4);
    const size_t valid = utf8::valid_prefix(buf);
    const size_t zero = std::string_view(buf.data(), valid).find('\0');
    if (zero != std::string_view::npos) return nul = true, base + zero;
    // A sequence cut by the chunk's end is carried into the next chunk.
    if (valid < buf.size() && (end || buf.size() - valid > 3)) return nul = false, base + valid;
    base += valid;
    buf.erase(0, valid);
  }
  return std::string::npos;
}

// The offset of the first NUL byte of `path` (npos: none); head gets its
// first four bytes.
size_t first_nul(const std::string& path, std::string& head) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<char> chunk(kChunk);
  head.clear();
  for (size_t base = 0;; base += kChunk) {
    in.read(chunk.data(), static_cast<std::streamsize>(kChunk));
    const auto got = static_cast<size_t>(in.gcount());
    if (in.bad()) throw IoError(fmt::format("{}: read failed at byte {}", path, base));
    if (head.size() < 4) head.append(chunk.data(), std::min(got, 4 - head.size()));
    const char* zero = std::find(chunk.data(), chunk.data() + got, '\0');
    if (zero != chunk.data() + got) return base + static_cast<size_t>(zero - chunk.data());
    if (got < kChunk) return std::string::npos;
  }
}

}  // namespace

void check_corpus_files(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    std::string head;
    const size_t at = first_nul(path, head);
    int32_t magic = 0;
    if (head.size() == 4) std::memcpy(&magic, head.data(), 4);
    if (magic == kLlmcMagic || magic == kLlmc32Magic)
      throw InputError(fmt::format("{}: an llm.c shard, not text: its first four bytes are {}, llm.c's magic; its "
                                   "tokens are read as they are by dpt train --data (dpt tokens --tokenizer reads text "
                                   "files or JSON lines)",
                                   path, hex_bytes(head)));
    if (at != std::string::npos)
      throw InputError(fmt::format("{}: not text: its first four bytes are {} and byte {} is a NUL; raw uint16 tokens "
                                   "need --from u16 without --tokenizer (dpt tokens --tokenizer reads text files or "
                                   "JSON lines)",
                                   path, hex_bytes(head), at));
  }
}

FormatFlags data_format_flags() { return {"--data-format u16", "--data-format bytes"}; }
FormatFlags tokens_from_flags() { return {"--from u16", "--from bytes"}; }

std::vector<std::string> text_input_files(const std::string& spec) {
  return spec.find_first_of("*?[") != std::string::npos ? expand_data_path(spec) : text_files(spec);
}

void check_text_files(const std::vector<std::string>& files, const FormatFlags& flags) {
  for (const std::string& path : files) {
    std::string head;
    bool nul = false;
    const size_t at = first_non_text(path, head, nul);
    if (at != std::string::npos) refuse(path, head, at, nul, flags);
  }
}

TokenFormat resolve_format(const std::string& spec, TokenFormat given, const FormatFlags& flags) {
  if (given != TokenFormat::Auto) return given;
  if (detect_format(spec) == TokenFormat::Llmc) return TokenFormat::Llmc;
  check_text_files(text_input_files(spec), flags);
  return TokenFormat::Bytes;
}

}  // namespace dpt
