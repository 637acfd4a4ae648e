// A text corpus through a BPE tokenizer into llm.c shards (`dpt tokens
// --tokenizer`, docs/tokenizer.md). Documents: a plain text file is one, a
// JSON lines file (.jsonl, .json, .ndjson) has one per line in its "text"
// field. As llm.c does, the delimiter token (<|endoftext|> or
// <|begin_of_text|>) goes before each document and special-token text inside
// a document is plain text. Tokens go to uint16 shards (magic 20240520) when
// the vocabulary fits, else to llm.c's uint32 shards (magic 20240801).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"

namespace dpt {

struct CorpusOptions {
  std::string input;  // file, directory or glob (data/token_shards.h's expand_data_path, text_files)
  std::string out, name = "data";
  int64_t shard_tokens = 100'000'000, val_tokens = 0;
};

struct CorpusProgress {
  int64_t documents = 0, tokens = 0;
  int64_t bytes = 0, total_bytes = 0;  // of the input files
  double seconds = 0;
  std::vector<std::string> shards;  // once written
  int token_bytes = 2;              // 2: uint16 shards, 4: uint32
};

// Tokenizes the corpus (documents in parallel, a batch at a time) and
// writes the shards as write_llmc_shards names them. `progress` is called
// after each batch. InputError for a file that is not text (a NUL byte), a
// JSON line without a "text" string, or a tokenizer without a delimiter.
CorpusProgress tokenize_corpus(const BpeTokenizer& tok, const CorpusOptions& opt,
                               const std::function<void(const CorpusProgress&)>& progress);

}  // namespace dpt
