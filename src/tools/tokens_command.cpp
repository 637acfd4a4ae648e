// `dpt tokens`: text or raw uint16 tokens in, llm.c-format shards out
// (data/shard_writer.h, docs/data.md); with --tokenizer, text through a
// byte-level BPE tokenizer (data/corpus_tokenizer.h, docs/tokenizer.md).
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "core/error.h"
#include "data/byte_corpus.h"
#include "data/corpus_tokenizer.h"
#include "data/file_kind.h"
#include "data/shard_writer.h"
#include "data/token_shards.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace dpt {

TokensCommand::TokensCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("tokens", "write llm.c-format token shards from text or raw uint16 tokens");
  cmd_->add_option("--input", input_, "text (file, directory or glob; default: the fortunes corpus) or uint16 files");
  from_opt_ = cmd_->add_option("--from", from_, "bytes: text, one token per byte (vocabulary 256); u16: raw uint16 tokens")
                  ->check(CLI::IsMember({"bytes", "u16"}));
  cmd_->add_option("--tokenizer", tokenizer_,
                   "a byte-level BPE tokenizer: tokenizer.json, vocab.json (merges.txt beside it) or a directory; "
                   "text files are documents, .jsonl lines' \"text\" too");
  cmd_->add_option("--out", out_, "directory for the shards")->required();
  cmd_->add_option("--name", name_, "shard name prefix: <out>/<name>_train_000000.bin ...");
  cmd_->add_option("--shard-tokens", shard_tokens_, "tokens per shard (llm.c's fineweb: 100,000,000)")
      ->check(positive());
  cmd_->add_option("--val-tokens", val_tokens_, "the last this many tokens go to <name>_val_000000.bin")
      ->check(non_negative());
}

int TokensCommand::run_tokenizer() {
  if (from_opt_->count() > 0) throw InputError("--from and --tokenizer contradict each other: give one of them");
  const BpeTokenizer tok = BpeTokenizer::load(tokenizer_);
  const bool tty = ::isatty(STDERR_FILENO);
  const auto show = [tty](const CorpusProgress& p) {
    const double mb = static_cast<double>(p.bytes) / 1e6;
    std::fprintf(stderr, "%stokens: %3.0f%% %.1f of %.1f MB, %lld documents, %lld tokens, %.1f MB/s%s",
                 tty ? "\r" : "", p.total_bytes ? 100.0 * static_cast<double>(p.bytes) / static_cast<double>(p.total_bytes) : 100.0,
                 mb, static_cast<double>(p.total_bytes) / 1e6, static_cast<long long>(p.documents),
                 static_cast<long long>(p.tokens), p.seconds > 0 ? mb / p.seconds : 0.0, tty ? "" : "\n");
  };
  const CorpusOptions opt{input_.empty() ? kFortunesDir : input_, out_, name_, shard_tokens_, val_tokens_};
  // Documents of text: a shard or raw tokens are refused before anything is written.
  check_corpus_files(text_input_files(opt.input));
  const CorpusProgress p = tokenize_corpus(tok, opt, show);
  if (tty) std::fputc('\n', stderr);
  std::printf("%lld documents, %lld tokens (vocabulary %u), %.1f MB in %.3f s (%.1f MB/s) into %zu %s shard%s in %s\n",
              static_cast<long long>(p.documents), static_cast<long long>(p.tokens), tok.vocab_size(),
              static_cast<double>(p.bytes) / 1e6, p.seconds,
              p.seconds > 0 ? static_cast<double>(p.bytes) / 1e6 / p.seconds : 0.0, p.shards.size(),
              p.token_bytes == 4 ? "uint32 (magic 20240801)" : "uint16 (magic 20240520)",
              p.shards.size() == 1 ? "" : "s", out_.c_str());
  return 0;
}

int TokensCommand::run() {
  if (!tokenizer_.empty()) return run_tokenizer();
  std::unique_ptr<TokenStream> in;
  if (from_ == "u16") {
    if (input_.empty()) throw InputError("--from u16 needs --input");
    in = std::make_unique<U16Tokens>(input_);
  } else {
    const std::string input = input_.empty() ? kFortunesDir : input_;
    // Text unless --from bytes says so: a shard or raw tokens are refused.
    if (from_opt_->count() == 0) check_text_files(text_input_files(input), tokens_from_flags());
    in = std::make_unique<TextTokens>(input);
  }
  const auto paths = write_llmc_shards(*in, out_, name_, shard_tokens_, val_tokens_);
  std::printf("%lld tokens into %zu shard%s in %s\n", static_cast<long long>(in->total()), paths.size(),
              paths.size() == 1 ? "" : "s", out_.c_str());
  return 0;
}

}  // namespace dpt
