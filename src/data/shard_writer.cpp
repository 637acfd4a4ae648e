#include "data/shard_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "data/byte_corpus.h"
#include "data/token_shards.h"
#include "io/atomic_file.h"

namespace dpt {

namespace fs = std::filesystem;

namespace {

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  if (ec) throw IoError(fmt::format("{}: cannot read its size ({})", path, ec.message()));
  return static_cast<int64_t>(n);
}

// Reads n bytes at offset `at` of a file, all of them or IoError.
void read_bytes(const std::string& path, int64_t at, int64_t n, void* out) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(at);
  in.read(static_cast<char*>(out), n);
  if (!in || in.gcount() != n)
    throw IoError(fmt::format("{}: cannot read {} bytes at byte {} (the file changed or is unreadable)", path, n, at));
}

}  // namespace

TextTokens::TextTokens(const std::string& spec)
    : files_(spec.find_first_of("*?[") != std::string::npos ? expand_data_path(spec) : text_files(spec)) {
  for (const std::string& f : files_) total_ += sizes_.emplace_back(file_size(f));
}

void TextTokens::read(uint16_t* out, int64_t n) {
  while (n > 0) {
    DPT_CHECK(file_ < files_.size(), "text stream read past its {} bytes", total_);
    const int64_t take = std::min(n, sizes_[file_] - at_);
    buf_.resize(static_cast<size_t>(take));
    if (take > 0) read_bytes(files_[file_], at_, take, buf_.data());
    std::copy(buf_.begin(), buf_.end(), out);  // a byte is its own token
    out += take;
    n -= take;
    at_ += take;
    if (at_ == sizes_[file_]) ++file_, at_ = 0;
  }
}

U16Tokens::U16Tokens(const std::string& spec) : files_(expand_data_path(spec)) {
  for (const std::string& f : files_) {
    const int64_t bytes = file_size(f);
    if (bytes % 2 != 0)
      throw InputError(fmt::format("{}: {} bytes, an odd number, cannot be uint16 tokens (byte {} is left over)", f,
                                   bytes, bytes - 1));
    total_ += sizes_.emplace_back(bytes / 2);
  }
}

void U16Tokens::read(uint16_t* out, int64_t n) {
  while (n > 0) {
    DPT_CHECK(file_ < files_.size(), "token stream read past its {} tokens", total_);
    const int64_t take = std::min(n, sizes_[file_] - at_);
    if (take > 0) read_bytes(files_[file_], 2 * at_, 2 * take, out);
    out += take;
    n -= take;
    at_ += take;
    if (at_ == sizes_[file_]) ++file_, at_ = 0;
  }
}

namespace {

// Streams n tokens of `in` into one shard file, a bounded buffer at a time.
void copy_shard(TokenStream& in, const std::string& path, int64_t n) {
  int32_t header[256] = {kLlmcMagic, kLlmcVersion, static_cast<int32_t>(n)};
  AtomicFile f(path);
  f.write(header, sizeof header);
  std::vector<uint16_t> buf(size_t{1} << 19);
  for (int64_t done = 0; done < n;) {
    const int64_t take = std::min<int64_t>(static_cast<int64_t>(buf.size()), n - done);
    in.read(buf.data(), take);
    f.write(buf.data(), 2 * static_cast<size_t>(take));
    done += take;
  }
  f.commit();
}

class SpanTokens : public TokenStream {
 public:
  SpanTokens(const uint16_t* p, int64_t n) : p_(p), n_(n) {}
  int64_t total() const override { return n_; }
  void read(uint16_t* out, int64_t n) override {
    std::copy(p_, p_ + n, out);
    p_ += n;
  }

 private:
  const uint16_t* p_;
  int64_t n_;
};

}  // namespace

void write_llmc_shard(const std::string& path, const uint16_t* tokens, int64_t n) {
  SpanTokens in(tokens, n);
  copy_shard(in, path, n);
}

std::vector<std::string> write_llmc_shards(TokenStream& in, const std::string& dir, const std::string& name,
                                           int64_t shard_tokens, int64_t val_tokens) {
  if (shard_tokens < 1 || shard_tokens > std::numeric_limits<int32_t>::max())
    throw InputError(fmt::format("shard size {} tokens is outside 1..{} (llm.c's count is an int32)", shard_tokens,
                                 std::numeric_limits<int32_t>::max()));
  const int64_t train = in.total() - val_tokens;
  if (val_tokens < 0 || train < 1)
    throw InputError(fmt::format("{} validation tokens leave none of the {} to train on", val_tokens, in.total()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("{}: cannot create directory ({})", dir, ec.message()));
  std::vector<std::string> paths;
  for (int64_t done = 0, i = 0; done < train; ++i) {
    const int64_t n = std::min(shard_tokens, train - done);
    paths.push_back((fs::path(dir) / fmt::format("{}_train_{:06d}.bin", name, i)).string());
    copy_shard(in, paths.back(), n);
    done += n;
  }
  if (val_tokens > 0) {
    if (val_tokens > std::numeric_limits<int32_t>::max())
      throw InputError(fmt::format("{} validation tokens do not fit one llm.c shard", val_tokens));
    paths.push_back((fs::path(dir) / fmt::format("{}_val_000000.bin", name)).string());
    copy_shard(in, paths.back(), val_tokens);
  }
  return paths;
}

}  // namespace dpt
