#include "data/corpus_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/byte_corpus.h"
#include "data/token_shards.h"
#include "data/utf8.h"
#include "io/atomic_file.h"

namespace dpt {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchBytes = size_t{32} << 20;  // text encoded per parallel batch

bool json_lines(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

void refuse_nul(std::string_view text, const std::string& path, int64_t offset) {
  if (const void* p = std::memchr(text.data(), 0, text.size()))
    throw InputError(fmt::format("{}: a NUL byte at byte {}: not text (give text files or JSON lines)", path,
                                 offset + (static_cast<const char*>(p) - text.data())));
}

// The "text" of one JSON line, invalid UTF-8 read as errors="replace".
std::string text_of_line(const std::string& line, const std::string& path, int64_t n) {
  const std::string clean = utf8::valid(line) ? line : utf8::replace_invalid(line);
  nlohmann::json j = nlohmann::json::parse(clean, nullptr, false);
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw InputError(fmt::format("{}: line {} is not a JSON object with a \"text\" string", path, n));
  return j["text"].get<std::string>();
}

// The temporary file of all tokens as uint32, split into shards at the end
// (the validation tail is known only then). Removed however the run ends.
class TokenSpill {
 public:
  explicit TokenSpill(std::string path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "w+b")) {
    if (!f_) throw IoError(fmt::format("{}: cannot create ({})", path_, std::strerror(errno)));
  }
  ~TokenSpill() {
    std::fclose(f_);
    std::remove(path_.c_str());
  }
  void write(const uint32_t* p, size_t n) {
    if (n && std::fwrite(p, sizeof *p, n, f_) != n)
      throw IoError(fmt::format("{}: write failed ({})", path_, std::strerror(errno)));
    count_ += static_cast<int64_t>(n);
  }
  void read(int64_t first, uint32_t* p, size_t n) {
    if (std::fseek(f_, static_cast<long>(first * 4), SEEK_SET) != 0 || std::fread(p, 4, n, f_) != n)
      throw IoError(fmt::format("{}: read failed", path_));
  }
  int64_t count() const { return count_; }

 private:
  std::string path_;
  std::FILE* f_;
  int64_t count_ = 0;
};

// Encodes a batch of documents in parallel and spills them, each after the delimiter.
void flush(const BpeTokenizer& tok, uint32_t delim, std::vector<std::string>& docs, TokenSpill& spill,
           CorpusProgress& p) {
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const auto ids = tok.encode_batch(views);
  for (const auto& d : ids) {
    spill.write(&delim, 1);
    spill.write(d.data(), d.size());
  }
  p.documents += static_cast<int64_t>(docs.size());
  p.tokens = spill.count();
  docs.clear();
}

// One shard of tokens [first, first + n) of the spill, header then tokens.
void write_shard(TokenSpill& spill, const std::string& path, int64_t first, int64_t n, int width) {
  const int32_t header[256] = {width == 4 ? kLlmc32Magic : kLlmcMagic, width == 4 ? kLlmc32Version : kLlmcVersion,
                               static_cast<int32_t>(n)};
  AtomicFile f(path);
  f.write(header, sizeof header);
  std::vector<uint32_t> buf(size_t{1} << 18);
  std::vector<uint16_t> narrow(buf.size());
  for (int64_t done = 0; done < n;) {
    const auto take = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf.size()), n - done));
    spill.read(first + done, buf.data(), take);
    if (width == 4) {
      f.write(buf.data(), 4 * take);
    } else {
      std::copy(buf.begin(), buf.begin() + static_cast<long>(take), narrow.begin());
      f.write(narrow.data(), 2 * take);
    }
    done += static_cast<int64_t>(take);
  }
  f.commit();
}

std::vector<std::string> write_shards(TokenSpill& spill, const CorpusOptions& opt, int width) {
  const int64_t train = spill.count() - opt.val_tokens;
  if (opt.val_tokens < 0 || train < 1)
    throw InputError(fmt::format("{} validation tokens leave none of the {} to train on", opt.val_tokens,
                                 spill.count()));
  if (opt.val_tokens > std::numeric_limits<int32_t>::max())
    throw InputError(fmt::format("{} validation tokens do not fit one llm.c shard", opt.val_tokens));
  std::vector<std::string> paths;
  for (int64_t done = 0, i = 0; done < train; ++i) {
    const int64_t n = std::min(opt.shard_tokens, train - done);
    paths.push_back((fs::path(opt.out) / fmt::format("{}_train_{:06d}.bin", opt.name, i)).string());
    write_shard(spill, paths.back(), done, n, width);
    done += n;
  }
  if (opt.val_tokens > 0) {
    paths.push_back((fs::path(opt.out) / fmt::format("{}_val_000000.bin", opt.name)).string());
    write_shard(spill, paths.back(), train, opt.val_tokens, width);
  }
  return paths;
}

std::vector<std::string> input_files(const std::string& spec) {
  return spec.find_first_of("*?[") != std::string::npos ? expand_data_path(spec) : text_files(spec);
}

}  // namespace

CorpusProgress tokenize_corpus(const BpeTokenizer& tok, const CorpusOptions& opt,
                               const std::function<void(const CorpusProgress&)>& progress) {
  const auto delim = tok.delimiter();
  if (!delim) throw InputError("the tokenizer has neither <|endoftext|> nor <|begin_of_text|> to put before each document");
  if (opt.shard_tokens < 1 || opt.shard_tokens > std::numeric_limits<int32_t>::max())
    throw InputError(fmt::format("shard size {} tokens is outside 1..{} (llm.c's count is an int32)",
                                 opt.shard_tokens, std::numeric_limits<int32_t>::max()));
  const std::vector<std::string> files = input_files(opt.input);
  CorpusProgress p;
  for (const std::string& f : files) p.total_bytes += static_cast<int64_t>(fs::file_size(f));
  std::error_code ec;
  fs::create_directories(opt.out, ec);
  if (ec) throw IoError(fmt::format("{}: cannot create directory ({})", opt.out, ec.message()));
  TokenSpill spill((fs::path(opt.out) / fmt::format(".{}_tokens.tmp", opt.name)).string());
  const auto t0 = std::chrono::steady_clock::now();
  const auto report = [&] {
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress(p);
  };
  std::vector<std::string> docs;
  size_t pending = 0;
  int64_t files_bytes = 0;  // of the files read whole
  const auto add = [&](std::string doc, int64_t bytes) {
    pending += doc.size();
    docs.push_back(std::move(doc));
    p.bytes = files_bytes + bytes;
    if (pending >= kBatchBytes) flush(tok, *delim, docs, spill, p), pending = 0, report();
  };
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw IoError(fmt::format("{}: cannot open", f));
    if (json_lines(f)) {
      std::string line;
      int64_t offset = 0;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        refuse_nul(line, f, offset);
        offset += static_cast<int64_t>(line.size()) + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        add(text_of_line(line, f, n), offset);
      }
    } else {
      std::string text{std::istreambuf_iterator<char>(in), {}};
      refuse_nul(text, f, 0);
      const auto bytes = static_cast<int64_t>(text.size());
      add(std::move(text), bytes);
    }
    files_bytes += static_cast<int64_t>(fs::file_size(f));
    p.bytes = files_bytes;
  }
  flush(tok, *delim, docs, spill, p);
  p.token_bytes = tok.vocab_size() <= 65536 ? 2 : 4;
  p.shards = write_shards(spill, opt, p.token_bytes);
  report();
  return p;
}

}  // namespace dpt
