// `dpt tokens`: text or raw uint16 tokens in, llm.c-format shards out
// (data/shard_writer.h, docs/data.md).
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "data/byte_corpus.h"
#include "data/shard_writer.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace dpt {

TokensCommand::TokensCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("tokens", "write llm.c-format token shards from text or raw uint16 tokens");
  cmd_->add_option("--input", input_, "text (file, directory or glob; default: the fortunes corpus) or uint16 files");
  cmd_->add_option("--from", from_, "bytes: text, one token per byte (vocabulary 256); u16: raw uint16 tokens")
      ->check(CLI::IsMember({"bytes", "u16"}));
  cmd_->add_option("--out", out_, "directory for the shards")->required();
  cmd_->add_option("--name", name_, "shard name prefix: <out>/<name>_train_000000.bin ...");
  cmd_->add_option("--shard-tokens", shard_tokens_, "tokens per shard (llm.c's fineweb: 100,000,000)")
      ->check(positive());
  cmd_->add_option("--val-tokens", val_tokens_, "the last this many tokens go to <name>_val_000000.bin")
      ->check(non_negative());
}

int TokensCommand::run() {
  std::unique_ptr<TokenStream> in;
  if (from_ == "u16") {
    if (input_.empty()) throw InputError("--from u16 needs --input");
    in = std::make_unique<U16Tokens>(input_);
  } else {
    in = std::make_unique<TextTokens>(input_.empty() ? kFortunesDir : input_);
  }
  const auto paths = write_llmc_shards(*in, out_, name_, shard_tokens_, val_tokens_);
  std::printf("%lld tokens into %zu shard%s in %s\n", static_cast<long long>(in->total()), paths.size(),
              paths.size() == 1 ? "" : "s", out_.c_str());
  return 0;
}

}  // namespace dpt
