// Tokenized datasets as the tools people already use write them: shards of
// uint16 tokens, memory-mapped so a dataset larger than RAM trains without
// being loaded (docs/data.md).
//
// Formats (one per dataset, every shard alike):
//   llmc   llm.c's shards: a header of 256 little-endian int32 (magic
//          20240520, version 1, token count, the rest zero), then the tokens
//          as little-endian uint16. The file size must be exactly
//          1024 + 2 x count. Or llm.c's shards for vocabularies past
//          65536 (Llama 3): magic 20240801, version 7, uint32 tokens, the
//          file 1024 + 4 x count. The two may be mixed.
//   u16    nanoGPT's raw .bin: uint16 tokens and nothing else. A raw file
//          carries no magic, so it is never guessed: it needs --data-format u16.
// Text (the byte vocabulary) is read by ByteCorpus, as before; detect_format
// tells the three apart.
//
// Every shard is checked when opened, before any training: the header, the
// file size, and every token against the vocabulary. The tokens are checked
// with bounded reads (pread into a 1 MiB buffer), not through the mapping, so
// checking a 100 GiB dataset raises the peak RSS by 1 MiB. A bad shard is
// refused with an InputError naming the file and the byte offset.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

enum class TokenFormat { Auto, Llmc, U16, Bytes };

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int32_t kLlmc32Magic = 20240801;  // llm.c's Llama 3 shards: uint32 tokens
constexpr int32_t kLlmc32Version = 7;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// "auto" | "llmc" | "u16" | "bytes"; InputError otherwise.
TokenFormat parse_token_format(const std::string& s);
const char* format_name(TokenFormat f);

// The files a --data value stands for, sorted by name: the file itself; a
// directory's regular files; or the matches of a glob (any of * ? [). Throws
// IoError for a missing path or a glob that matches nothing.
std::vector<std::string> expand_data_path(const std::string& spec);

// Llmc when the first file of `spec` starts with an llm.c magic, else Bytes
// (text). U16 is never returned: raw tokens cannot be told from text.
TokenFormat detect_format(const std::string& spec);

class TokenShards {
 public:
  // Maps and checks every shard of `spec` (see expand_data_path) in `format`
  // (Llmc or U16). Tokens must be below `vocab`.
  TokenShards(const std::string& spec, TokenFormat format, int64_t vocab);
  ~TokenShards();
  TokenShards(const TokenShards&) = delete;
  TokenShards& operator=(const TokenShards&) = delete;

  size_t count() const { return shards_.size(); }
  const std::string& path(size_t shard) const { return shards_[shard].path; }
  int64_t tokens(size_t shard) const { return shards_[shard].tokens; }
  int64_t total_tokens() const;

  // Copies tokens [first, first + n) of a shard into out (widened to int32).
  // A read's page fault maps more than the bytes it touches: the kernel maps
  // the whole page-cache folio (up to 2 MiB once the check has read the file
  // into large folios) or, for small pages, fault_around_bytes of
  // neighbours; all of it counts in this process's RSS until unmapped
  // (measured: without dropping, 1024 random windows of a 512 MiB shard
  // brought 330 MiB into the RSS). So once the reads since the last drop may
  // have mapped kDropBytes, assuming kFolioBytes per folio touched, the
  // mapped pages are dropped from this process (madvise DONTNEED; the page
  // cache keeps them): random reads over any dataset add at most about
  // kDropBytes to the RSS.
  void read(size_t shard, int64_t first, int64_t n, int32_t* out) const;

  static constexpr size_t kDropBytes = size_t{32} << 20;
  static constexpr size_t kFolioBytes = size_t{2} << 20;

 private:
  struct Shard {
    std::string path;
    const uint8_t* map = nullptr;  // the whole file
    size_t bytes = 0;
    const uint8_t* data = nullptr;  // the first token
    int64_t tokens = 0;
    size_t width = 2;  // bytes per token: 4 for llm.c's uint32 shards
  };
  void drop_pages() const;

  std::vector<Shard> shards_;
  // Shared by naive DP's replica threads, which read the same shards.
  mutable std::atomic<size_t> copied_since_drop_{0};
};

}  // namespace dpt
