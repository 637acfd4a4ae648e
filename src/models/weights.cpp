#include "models/weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "models/decoder.h"
#include "models/hf_config.h"

namespace dpt {

namespace {

// Buffers PyTorch checkpoints may carry that are not parameters: nanoGPT's
// and Hugging Face's causal mask. They hold no learned state, so they are
// skipped.
bool is_known_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// out [cols, rows] = the transpose of in [rows, cols].
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// The sentence for a tensor whose shape is not the model's. In the other
// layout's shape, the file's layout is the likely mistake, so it says so.
std::string shape_mismatch(const std::string& path, const std::string& name, const std::vector<int64_t>& got,
                           const std::vector<int64_t>& want) {
  const bool swapped = got.size() == 2 && want.size() == 2 && got[0] == want[1] && got[1] == want[0];
  return fmt::format("{}: tensor '{}' has shape {} but the model expects {}{}", path, name, shape_str(got),
                     shape_str(want),
                     swapped ? " (its transpose: is --load-format right? hf stores Conv1D weights [in, out])" : "");
}

// Checks the model's tensors against a file's headers (shapes, missing and
// unexpected names); returns the file name of the tied wte when the file
// also has an lm_head.weight to compare with it.
std::optional<std::string> check_names(const Model& model, const SafetensorsSet& file, const WeightNames& names) {
  const std::vector<TensorSpec>& tensors = file.tensors();
  const std::string& path = file.path();
  const Layout& layout = model.layout();
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& t : tensors) by_name[t.name] = &t;
  std::map<std::string, bool> expected;
  // A pipeline stage reads its own tensors from a whole model's file: the
  // other stages' are expected too, and left alone.
  if (const auto* decoder = dynamic_cast<const Decoder*>(&model); decoder && !decoder->whole()) {
    const Decoder whole(decoder->config());
    for (const Slot& s : whole.layout().slots()) expected[names.file_name(s.name)] = true;
  }
  for (const Slot& s : layout.slots()) {
    const std::string name = names.file_name(s.name);
    expected[name] = true;
    auto it = by_name.find(name);
    if (it == by_name.end()) throw InputError(fmt::format("{}: tensor '{}' is missing", path, name));
    const std::vector<int64_t> want = names.file_shape(s.name, s.whole_shape);  // a slice's whole tensor
    if (it->second->shape != want) throw InputError(shape_mismatch(file.file_of(name), name, it->second->shape, want));
  }
  std::optional<std::string> tied;
  for (const TensorSpec& t : tensors) {
    if (expected.count(t.name) || is_known_buffer(t.name)) continue;
    const auto* decoder = dynamic_cast<const Decoder*>(&model);
    if (t.name == "lm_head.weight" && decoder && decoder->tied()) {
      tied = names.file_name(decoder->embedding_name());
      if (!by_name.count(*tied) || t.shape != by_name[*tied]->shape)
        throw InputError(fmt::format("{}: lm_head.weight differs from {}, but this model ties them", path, *tied));
      continue;
    }
    throw InputError(fmt::format("{}: unexpected tensor '{}' for a {} model", file.file_of(t.name), t.name,
                                 model.kind()));
  }
  return tied;
}

// Elements [first, last) of the whole tensor of slot s, in the model's
// layout, into dst: a transposed HF weight's piece of each stored row, zero
// past what the file stores (wte's pad rows). rows: scratch.
void read_tensor_range(const SafetensorsSet& file, const WeightNames& names, const Slot& s, size_t first,
                       size_t last, float* dst, std::vector<float>& rows) {
  const std::string name = names.file_name(s.name);
  if (!names.transposed(s.name)) {
    const size_t stored = names.stored(s.name, s.whole_shape, s.numel * static_cast<size_t>(s.slice.parts));
    const size_t read_hi = std::min(last, std::max(first, stored));
    if (read_hi > first) file.read(name, first, read_hi - first, dst);
    std::fill(dst + (read_hi - first), dst + (last - first), 0.0f);
    return;
  }
  // The tensor is [O, I] and the file holds [I, O]: elements [first, last)
  // lie in rows o_lo..o_hi-1, which are columns of every stored row; read
  // that piece of each stored row, then pick the elements.
  const auto I = static_cast<size_t>(s.whole_shape[1]), O = static_cast<size_t>(s.whole_shape[0]);
  const size_t o_lo = first / I, o_hi = (last - 1) / I + 1, width = o_hi - o_lo;
  rows.resize(I * width);
  for (size_t i = 0; i < I; ++i) file.read(name, i * O + o_lo, width, rows.data() + i * width);
  for (size_t k = first; k < last; ++k) dst[k - first] = rows[(k % I) * width + (k / I - o_lo)];
}

}  // namespace

bool sharded_save(const std::string& path, uint64_t max_shard_bytes) {
  return max_shard_bytes > 0 || path.ends_with(".safetensors.index.json");
}

WeightWriter::WeightWriter(const std::string& path, const Model& model, const SaveOptions& options)
    : model_(model),
      names_(weight_names(model, {}, options.format == WeightFormat::Hf ? options.format : WeightFormat::Dpt)) {
  const WeightFormat format = options.format;
  const uint64_t max_shard_bytes = options.shard_bytes;
  std::vector<TensorSpec> specs;
  for (const Slot& s : model.layout().slots()) {
    DPT_CHECK(s.slice.parts == 1, "{} is a tensor-parallel slice: write the whole model (parallel/tensor_parallel.h)",
              s.name);
    specs.push_back({names_.file_name(s.name), options.dtype, names_.file_shape(s.name, s.shape)});
  }
  std::map<std::string, std::string> meta = model.metadata();
  // What Hugging Face's loaders look for (transformers refuses a file
  // without it): every file in their layout, GPT-2's or the Llama family's.
  if (names_.hf || format == WeightFormat::Hf) meta["format"] = "pt";
  if (sharded_save(path, max_shard_bytes))
    shards_ = std::make_unique<ShardedSafetensorsWriter>(path, std::move(specs), meta,
                                                         max_shard_bytes > 0 ? max_shard_bytes : kDefaultShardBytes);
  else
    file_.emplace(path, std::move(specs), meta);
}

void WeightWriter::put(const float* values, size_t n) {
  if (shards_)
    shards_->write(values, n);
  else
    file_->write(values, n);
}

void WeightWriter::write_unit(int unit, const float* values) {
  const Layout& layout = model_.layout();
  const size_t base = layout.units()[static_cast<size_t>(unit)].offset;
  for (const Slot& s : layout.slots()) {
    if (s.unit != unit) continue;
    const float* p = values + (s.offset - base);
    if (names_.transposed(s.name)) {
      scratch_.resize(s.numel);
      transpose(p, s.shape[0], s.shape[1], scratch_.data());
      p = scratch_.data();
    }
    put(p, names_.stored(s.name, s.shape, s.numel));  // not wte's pad rows
  }
}

void WeightWriter::commit() {
  if (shards_)
    shards_->commit();
  else
    file_->commit();
}

void save_weights(const Model& model, const std::string& path, WeightFormat format, uint64_t max_shard_bytes) {
  save_weights(model, path, SaveOptions{format, max_shard_bytes, DType::F32});
}

void save_weights(const Model& model, const std::string& path, const SaveOptions& options) {
  WeightWriter w(path, model, options);
  std::vector<float> host;  // a GPU model's unit, downloaded
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    const Unit& unit = model.layout().units()[u];
    const float* values = model.params() + unit.offset;
    if (model.device() != Device::CPU) {
      host.resize(unit.numel);
      model.download_params(unit.offset, unit.numel, host.data());
      values = host.data();
    }
    w.write_unit(static_cast<int>(u), values);
  }
  w.commit();
}

void load_weights(Model& model, const SafetensorsSet& file, WeightFormat format) {
  check_weight_file(model, file, format);
  // A GPU model's weights are put together on the host, then uploaded once.
  std::vector<float> host(model.device() == Device::CPU ? 0 : model.param_count());
  float* params = host.empty() ? model.params() : host.data();
  load_weight_range(model, file, 0, model.param_count(), params, format);
  if (!host.empty()) model.upload_params(0, host.size(), host.data());
}

void load_weights(Model& model, const std::string& path, WeightFormat format) {
  load_weights(model, SafetensorsSet(path), format);
}

void check_weight_file(const Model& model, const SafetensorsSet& file, WeightFormat format) {
  const WeightNames names = weight_names(model, file.tensors(), format);
  const auto tied = check_names(model, file, names);
  if (!tied) return;
  const uint64_t numel = file.find(*tied)->numel();
  constexpr size_t kPiece = 1 << 16;
  std::vector<float> a(kPiece), b(kPiece);
  for (uint64_t at = 0; at < numel; at += kPiece) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, numel - at));
    file.read("lm_head.weight", at, n, a.data());
    file.read(*tied, at, n, b.data());
    if (std::memcmp(a.data(), b.data(), n * sizeof(float)) != 0)
      throw InputError(fmt::format("{}: lm_head.weight differs from {}, but this model ties them", file.path(), *tied));
  }
}

void load_weight_range(const Model& model, const SafetensorsSet& file, size_t begin, size_t n, float* out,
                       WeightFormat format) {
  const WeightNames names = weight_names(model, file.tensors(), format);
  const size_t end = begin + n;
  std::vector<float> rows;
  for (const Slot& s : model.layout().slots()) {
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    // A slice is runs of `inner` consecutive elements of the whole tensor
    // (a whole slot is one run).
    const auto inner = static_cast<size_t>(s.slice.inner);
    float* dst = out + (lo - begin);
    for (size_t i = lo - s.offset; i < hi - s.offset;) {
      const size_t run_end = std::min(hi - s.offset, (i / inner + 1) * inner);
      const size_t e = s.slice.whole_index(i);
      read_tensor_range(file, names, s, e, e + (run_end - i), dst, rows);
      dst += run_end - i;
      i = run_end;
    }
  }
}

void save_hf_config(const Model& model, const std::string& path, WeightFormat format) {
  if (format == WeightFormat::Hf && model.kind() == "llama") write_hf_config(path, model.metadata());
}

std::unique_ptr<Model> model_from_file(const std::string& path,
                                       const std::map<std::string, std::string>& overrides, WeightFormat format) {
  auto model = make_model(hparams_for_file(path, overrides));
  load_weights(*model, path, format);
  return model;
}

}  // namespace dpt
