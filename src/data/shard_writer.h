// Writing llm.c-format token shards (the format data/token_shards.h reads):
// `dpt tokens` turns text (the byte vocabulary, token = byte) or a stream of
// raw uint16 tokens into shards, so users' text and the bundled corpus go
// through the same reader as FineWeb's shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

// A source of tokens whose count is known before reading (so each shard's
// header is written before its tokens and nothing is buffered whole).
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual int64_t total() const = 0;
  // Fills out[0, n) with the next n tokens (n never runs past total()).
  virtual void read(uint16_t* out, int64_t n) = 0;
};

// Text as bytes: a file, or a directory's files in name order without
// fortune's .dat/.u8 (exactly the bytes ByteCorpus concatenates), or a glob.
class TextTokens : public TokenStream {
 public:
  explicit TextTokens(const std::string& spec);
  int64_t total() const override { return total_; }
  void read(uint16_t* out, int64_t n) override;

 private:
  std::vector<std::string> files_;
  std::vector<int64_t> sizes_;
  size_t file_ = 0;
  int64_t at_ = 0, total_ = 0;  // at_: bytes read of files_[file_]
  std::vector<uint8_t> buf_;
};

// Raw little-endian uint16 tokens (nanoGPT's .bin), files in name order.
class U16Tokens : public TokenStream {
 public:
  explicit U16Tokens(const std::string& spec);
  int64_t total() const override { return total_; }
  void read(uint16_t* out, int64_t n) override;

 private:
  std::vector<std::string> files_;
  std::vector<int64_t> sizes_;  // in tokens
  size_t file_ = 0;
  int64_t at_ = 0, total_ = 0;
};

// Writes one llm.c shard (header then tokens) atomically.
void write_llmc_shard(const std::string& path, const uint16_t* tokens, int64_t n);

// Writes the stream as shards "<dir>/<name>_train_000000.bin", ... of at most
// shard_tokens tokens each, the last val_tokens tokens going to
// "<dir>/<name>_val_000000.bin" (none when 0). Each file is written through
// AtomicFile, so an interrupted run leaves no partial shard. Returns the
// paths written. InputError when val_tokens leaves no training tokens or
// shard_tokens exceeds llm.c's int32 count.
std::vector<std::string> write_llmc_shards(TokenStream& in, const std::string& dir, const std::string& name,
                                           int64_t shard_tokens, int64_t val_tokens);

}  // namespace dpt
