// What a data file is read as (docs/data.md, "What is read as what"): llm.c
// shards by their magic number, text only when a flag says so or the file is
// valid UTF-8 without a NUL byte. Anything else is refused before training,
// in one sentence naming the file, its first four bytes and the flags that
// fit, so a damaged shard or nanoGPT's raw uint16 train.bin is never read
// as text.
#pragma once

#include <string>
#include <vector>

#include "data/token_shards.h"

namespace dpt {

// How the command at hand spells the formats, for the refusal: `dpt train`
// and `dpt eval` say "--data-format u16", `dpt tokens` "--from u16".
struct FormatFlags {
  std::string u16;    // raw uint16 tokens
  std::string bytes;  // text, one token per byte
};
FormatFlags data_format_flags();  // --data-format u16, --data-format bytes
FormatFlags tokens_from_flags();  // --from u16, --from bytes

// The files a text spec stands for, as the text readers take them: a glob's
// matches, else text_files (a file, or a directory without .dat and .u8).
std::vector<std::string> text_input_files(const std::string& spec);

// Throws InputError for the first file (in order) that holds a NUL byte or
// is not valid UTF-8. Reads each file in bounded chunks (1 MiB).
void check_text_files(const std::vector<std::string>& files, const FormatFlags& flags);

// `dpt tokens --tokenizer`'s inputs, documents of text: throws InputError
// for the first file (in order) that starts with an llm.c magic number (a
// shard: tokens already) or holds a NUL byte, in one sentence naming the
// file, its first four bytes and the flags that fit. Invalid UTF-8 without
// a NUL is text the tokenizer reads as errors="replace" does.
void check_corpus_files(const std::vector<std::string>& files);

// The format `spec` is read in: `given` when it is not Auto; else Llmc when
// its first file starts with an llm.c magic number; else Bytes when every
// file is text (check_text_files); else InputError.
TokenFormat resolve_format(const std::string& spec, TokenFormat given, const FormatFlags& flags);

}  // namespace dpt
