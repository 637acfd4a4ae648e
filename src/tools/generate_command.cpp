// `dpt generate` (docs/generate.md): text from a trained model, one token
// at a time over the decoder's key/value cache.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "data/bpe_tokenizer.h"
#include "data/utf8.h"
#include "io/read_checks.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/hf_config.h"
#include "models/sampling.h"
#include "models/weights.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace dpt {

namespace {

// Token ids written as "1, 2 3" (commas and/or spaces). A comma without an
// id on each side is refused: "1,,2" or "1,2," is more likely a list missing
// an id than 1,2.
std::vector<int32_t> parse_ids(const std::string& text) {
  bool id_before = false;  // since the start or the last comma
  for (const char c : text) {
    if (c != ',') {
      id_before = id_before || c != ' ';
      continue;
    }
    if (!id_before) throw InputError(fmt::format("--prompt-ids '{}': a comma with no id before it", text));
    id_before = false;
  }
  if (!id_before && text.find(',') != std::string::npos)
    throw InputError(fmt::format("--prompt-ids '{}': a comma with no id after it", text));
  std::string s = text;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > INT32_MAX)
      throw InputError(fmt::format("--prompt-ids: '{}' is not a token id", word));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::string read_file(const std::string& path) {
  refuse_directory(path, "a prompt file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open the prompt file", path));
  return {std::istreambuf_iterator<char>(in), {}};
}

// Writes generated tokens to stdout as they come: their text (the
// tokenizer's decoding, or the bytes themselves for a byte-level model)
// with a UTF-8 sequence split across tokens held until it is complete, or
// their ids.
class TokenWriter {
 public:
  TokenWriter(const BpeTokenizer* tokenizer, bool ids) : tok_(tokenizer), ids_(ids) {}
  // An end-of-sequence token is written as an id, not as text.
  void put(int32_t id, bool end_of_sequence) {
    if (ids_) {
      std::printf("%s%d", count_++ ? " " : "", id);
    } else if (!end_of_sequence) {
      pending_ += tok_ ? tok_->decode({static_cast<uint32_t>(id)}) : std::string(1, static_cast<char>(id));
      write(utf8::complete_prefix(pending_));
    }
    std::fflush(stdout);
  }
  void finish() {
    write(pending_.size());
    // A terminal gets its line ended; a pipe or a file gets the text as it is.
    if (ids_ || (last_ != '\n' && last_ != 0 && ::isatty(STDOUT_FILENO))) std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  void write(size_t n) {
    if (n == 0) return;
    std::fwrite(pending_.data(), 1, n, stdout);
    last_ = pending_[n - 1];
    pending_.erase(0, n);
  }
  const BpeTokenizer* tok_;
  bool ids_;
  std::string pending_;
  char last_ = 0;
  int64_t count_ = 0;
};

void report(const Generation& g, int64_t prompt) {
  const auto rate = [](size_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
  std::fprintf(stderr,
               "prompt: %lld tokens in %.3f s (%.1f tokens/s); generated: %zu tokens in %.3f s (%.1f tokens/s)"
               "%s%s\n",
               static_cast<long long>(prompt), g.prompt_s, rate(static_cast<size_t>(prompt), g.prompt_s),
               g.tokens.size(), g.generate_s, rate(g.tokens.size(), g.generate_s), g.stop.empty() ? "" : "; stopped ",
               g.stop.c_str());
}

}  // namespace

GenerateCommand::GenerateCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("generate", "generate text from saved weights (docs/generate.md)");
  model_.add(cmd_);
  cmd_->add_option("--weights", weights_, "weights: a safetensors file, an index or a Hugging Face directory")
      ->required();
  cmd_->add_option("--load-format", load_format_, "--weights' layout: dpt or hf (default: told by names and shapes)")
      ->check(CLI::IsMember({"dpt", "hf"}));
  cmd_->add_option("--tokenizer", tokenizer_,
                   "tokenizer.json (or vocab.json with merges.txt, or their directory); without it a byte-level "
                   "model (vocabulary 256) reads and writes raw bytes");
  prompt_opt_ = cmd_->add_option("--prompt", prompt_, "the prompt's text");
  prompt_file_opt_ = cmd_->add_option("--prompt-file", prompt_file_, "a file whose contents are the prompt");
  prompt_ids_opt_ = cmd_->add_option("--prompt-ids", prompt_ids_, "the prompt as token ids: \"1,2,3\"");
  cmd_->add_option("--output", output_, "text (default) or ids: the generated tokens' ids, space-separated")
      ->check(CLI::IsMember({"text", "ids"}));
  cmd_->add_option("--max-new-tokens", max_new_, "tokens to generate at most (128)")->check(positive());
  cmd_->add_option("--temperature", sampling_.temperature, "logits / temperature (1; 0: greedy)")
      ->check(non_negative());
  cmd_->add_option("--top-k", sampling_.top_k, "sample from the k most likely tokens (0: all)")->check(non_negative());
  cmd_->add_option("--top-p", sampling_.top_p,
                   "then from the fewest most likely tokens whose probabilities reach p (1: all)")
      ->check(number_check(0, 1, true, false, "in (0, 1]"));
  cmd_->add_flag("--greedy", sampling_.greedy, "the most likely token every time (no sampling)");
  cmd_->add_option("--seed", seed_, "the sampler's seed (1337): the same seed, the same text");
  cmd_->add_flag("--ignore-eos", ignore_eos_, "do not stop at the model's end-of-sequence tokens");
  cmd_->add_flag("--no-cache", no_cache_,
                 "a full forward over the whole sequence for every token instead of the key/value cache (for "
                 "comparison: same tokens, slower)");
  cmd_->add_option("--threads", threads_, "threads (default: all cores)")->check(non_negative());
  add_gemm_flag(cmd_, gemm_);
  add_precision_flag(cmd_, precision_);
}

std::optional<BpeTokenizer> GenerateCommand::tokenizer(int64_t vocab) const {
  const bool text_in = prompt_ids_opt_->count() == 0, text_out = output_ == "text";
  if (tokenizer_.empty()) {
    if (vocab != 256 && (text_in || text_out))
      throw InputError(fmt::format("{} has a vocabulary of {} tokens, so {} needs --tokenizer (without one only a "
                                   "byte-level model, vocabulary 256, reads and writes raw bytes)",
                                   weights_, vocab, text_in ? "a text prompt" : "text output"));
    return std::nullopt;
  }
  BpeTokenizer tok = BpeTokenizer::load(tokenizer_);
  if (tok.vocab_size() > vocab)
    throw InputError(fmt::format("{}'s {} tokens do not fit the model's vocabulary of {}", tokenizer_,
                                 tok.vocab_size(), vocab));
  return tok;
}

std::vector<int32_t> GenerateCommand::prompt(const BpeTokenizer* tok) const {
  const size_t given = prompt_opt_->count() + prompt_file_opt_->count() + prompt_ids_opt_->count();
  if (given != 1) throw InputError("give the prompt once: --prompt, --prompt-file or --prompt-ids");
  if (prompt_ids_opt_->count()) return parse_ids(prompt_ids_);
  const std::string text = prompt_opt_->count() ? prompt_ : read_file(prompt_file_);
  if (!tok) {
    std::vector<int32_t> bytes;  // a byte-level model: one token per byte
    for (const char c : text) bytes.push_back(static_cast<unsigned char>(c));
    return bytes;
  }
  const std::vector<uint32_t> ids = tok->encode(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

int GenerateCommand::run() {
  set_gemm_flag(gemm_);
  set_threads(threads_);
  check_sampling(sampling_);
  auto model = model_from_file(weights_, model_.hparams(), parse_weight_format(load_format_));
  auto* decoder = dynamic_cast<Decoder*>(model.get());
  if (!decoder)
    throw InputError(fmt::format("{} holds an {} model, and dpt generate needs a gpt or llama one", weights_,
                                 model->kind()));
  model->set_precision(parse_precision(precision_));
  const std::optional<BpeTokenizer> tok = tokenizer(decoder->config().vocab);
  const std::vector<int32_t> ids = prompt(tok ? &*tok : nullptr);
  const std::vector<int32_t> eos = ignore_eos_ ? std::vector<int32_t>{} : hf_eos_token_ids(weights_);
  TokenSampler sampler(sampling_, seed_);
  TokenWriter out(tok ? &*tok : nullptr, output_ == "ids");
  const Generation g =
      generate(*decoder, ids, max_new_, sampler, eos, [&out](int32_t t, bool end) { out.put(t, end); }, no_cache_);
  out.finish();
  report(g, static_cast<int64_t>(ids.size()));
  return 0;
}

}  // namespace dpt
