#include "io/safetensors_set.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/read_checks.h"

namespace dpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// A shard as an index may name it: a file beside the index, no folder.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos;
}

uint64_t data_bytes(const TensorSpec& t) { return t.numel() * dtype_size(t.dtype); }

nlohmann::json read_index(const std::string& path) {
  refuse_directory(path, "a safetensors index");
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open the index", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw IoError(fmt::format("{}: not a safetensors index: not valid JSON (byte {})", path, e.byte));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw IoError(fmt::format("{}: not a safetensors index: it has no \"weight_map\" object mapping each tensor "
                              "name to its shard file",
                              path));
  if (j["weight_map"].empty()) throw IoError(fmt::format("{}: the index's weight_map names no tensor", path));
  return j;
}

}  // namespace

std::string resolve_safetensors_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {kIndexName, kSingleName})
    if (fs::exists(fs::path(path) / name, ec)) return (fs::path(path) / name).string();
  throw IoError(fmt::format("{}: a directory holding neither {} nor {}", path, kIndexName, kSingleName));
}

// ---- SafetensorsSet ----

SafetensorsSet::SafetensorsSet(const std::string& path) : path_(resolve_safetensors_path(path)) {
  sharded_ = path_.ends_with(".json");
  if (sharded_)
    open_index();
  else
    add_file(std::make_unique<SafetensorsReader>(path_));
}

SafetensorsSet::~SafetensorsSet() = default;

void SafetensorsSet::add_file(std::unique_ptr<SafetensorsReader> file) {
  const size_t f = files_.size();
  for (const TensorSpec& t : file->tensors()) {
    if (auto it = file_of_.find(t.name); it != file_of_.end())
      throw IoError(fmt::format("{}: tensor '{}' is in two shards, {} and {}", path_, t.name,
                                fs::path(files_[it->second]->path()).filename().string(),
                                fs::path(file->path()).filename().string()));
    file_of_[t.name] = f;
    spec_of_[t.name] = tensors_.size();
    tensors_.push_back(t);
  }
  for (const auto& [key, value] : file->metadata()) {
    auto [it, added] = metadata_.emplace(key, value);
    if (!added && it->second != value)
      throw IoError(fmt::format("{}: metadata '{}' is '{}' here but '{}' in another shard of {}", file->path(), key,
                                value, it->second, path_));
  }
  files_.push_back(std::move(file));
}

void SafetensorsSet::open_index() {
  const nlohmann::json index = read_index(path_);
  std::map<std::string, std::string> shard_of;                 // tensor -> shard file name
  std::map<std::string, std::vector<std::string>> tensors_in;  // shard file name -> its tensors
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || !plain_file_name(file.get<std::string>()))
      throw IoError(fmt::format("{}: weight_map gives tensor '{}' the shard {}, which is not the name of a file "
                                "beside the index",
                                path_, name, file.dump()));
    shard_of[name] = file.get<std::string>();
    tensors_in[file.get<std::string>()].push_back(name);
  }
  const fs::path dir = fs::path(path_).parent_path();
  for (const auto& [file, names] : tensors_in) {  // in name order: model-00001-of-0000n first
    std::error_code ec;
    if (!fs::exists(dir / file, ec))
      throw IoError(fmt::format("{}: shard {} is missing (the index maps {} tensor{} to it, '{}' first)", path_, file,
                                names.size(), names.size() == 1 ? "" : "s", names.front()));
    add_file(std::make_unique<SafetensorsReader>((dir / file).string()));
  }
  for (const TensorSpec& t : tensors_)
    if (!shard_of.count(t.name))
      throw IoError(fmt::format("{}: tensor '{}' is not in the index {}", file_of(t.name), t.name, path_));
  for (const auto& [name, file] : shard_of) {
    auto it = file_of_.find(name);
    if (it == file_of_.end() || fs::path(files_[it->second]->path()).filename() != file)
      throw IoError(fmt::format("{}: tensor '{}' is mapped to {}, which does not hold it", path_, name, file));
  }
}

std::vector<std::string> SafetensorsSet::files() const {
  std::vector<std::string> paths;
  for (const auto& f : files_) paths.push_back(f->path());
  return paths;
}

const TensorSpec* SafetensorsSet::find(const std::string& name) const {
  auto it = spec_of_.find(name);
  return it == spec_of_.end() ? nullptr : &tensors_[it->second];
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  DPT_CHECK(it != file_of_.end(), "{}: no tensor '{}'", path_, name);
  return files_[it->second]->path();
}

void SafetensorsSet::read(const std::string& name, uint64_t begin, uint64_t n, float* out) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw InputError(fmt::format("{}: no tensor '{}'", path_, name));
  files_[it->second]->read(name, begin, n, out);
}

// ---- Writing ----

ShardNames shard_names(const std::string& path, size_t n) {
  constexpr std::string_view kIndexTail = ".safetensors.index.json", kTail = ".safetensors";
  ShardNames names;
  std::string stem;
  if (path.ends_with(kIndexTail)) {
    stem = path.substr(0, path.size() - kIndexTail.size());
    names.index = path;
  } else if (path.ends_with(kTail)) {
    stem = path.substr(0, path.size() - kTail.size());
    names.index = path + ".index.json";
  } else {
    throw InputError(fmt::format("{}: a sharded checkpoint's path must end in .safetensors.index.json (its index) "
                                 "or .safetensors",
                                 path));
  }
  for (size_t k = 0; k < n; ++k) names.shards.push_back(fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, k + 1, n));
  return names;
}

std::vector<size_t> plan_shards(const std::vector<TensorSpec>& tensors, uint64_t max_bytes) {
  std::vector<size_t> first = {0};
  uint64_t bytes = 0;  // in the file being filled
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = data_bytes(tensors[i]);
    if (max_bytes > 0 && i > first.back() && bytes + b > max_bytes) {
      first.push_back(i);
      bytes = 0;
    }
    bytes += b;
  }
  return first;
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                                                   const std::map<std::string, std::string>& metadata,
                                                   uint64_t max_shard_bytes)
    : tensors_(std::move(tensors)), metadata_(metadata) {
  first_ = plan_shards(tensors_, max_shard_bytes);
  names_ = shard_names(path, first_.size());
  first_.push_back(tensors_.size());
  // Each shard's writer checks its own tensors; a name repeated across
  // shards only this whole list shows.
  std::set<std::string> seen;
  for (const TensorSpec& t : tensors_)
    if (!seen.insert(t.name).second)
      throw InputError(fmt::format("{}: tensor name '{}' is empty, reserved or repeated", names_.index, t.name));
  for (size_t k = 0; k + 1 < first_.size(); ++k) {
    uint64_t values = 0;
    for (size_t i = first_[k]; i < first_[k + 1]; ++i) {
      values += tensors_[i].numel();
      total_bytes_ += data_bytes(tensors_[i]);
    }
    shard_values_.push_back(values);
    expected_ += values;
  }
  shards_.resize(shard_values_.size());
  open_shard(0);  // its temporary file: a bad path fails now, before any work
  settle();
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() = default;

void ShardedSafetensorsWriter::open_shard(size_t k) {
  std::vector<TensorSpec> specs(tensors_.begin() + static_cast<ptrdiff_t>(first_[k]),
                                tensors_.begin() + static_cast<ptrdiff_t>(first_[k + 1]));
  shards_[k] = std::make_unique<SafetensorsWriter>(names_.shards[k], std::move(specs), metadata_);
}

void ShardedSafetensorsWriter::settle() {
  while (current_ < shards_.size() && done_ == shard_values_[current_]) {
    shards_[current_]->seal();  // complete on disk under its temporary name
    done_ = 0;
    if (++current_ < shards_.size()) open_shard(current_);
  }
}

void ShardedSafetensorsWriter::write(const float* values, size_t n) {
  received_ += n;  // values past the end are counted, and reported by commit()
  while (n > 0 && current_ < shards_.size()) {
    const uint64_t k = std::min<uint64_t>(n, shard_values_[current_] - done_);
    shards_[current_]->write(values, k);
    values += k;
    n -= k;
    done_ += k;
    settle();
  }
}

void ShardedSafetensorsWriter::commit() {
  if (received_ != expected_) {
    shards_.clear();  // removes the temporaries
    throw IoError(fmt::format("{}: {} values were written but the tensors hold {}", names_.index, received_,
                              expected_));
  }
  nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as Hugging Face writes it
  for (size_t k = 0; k < shards_.size(); ++k)
    for (size_t i = first_[k]; i < first_[k + 1]; ++i)
      weight_map[tensors_[i].name] = fs::path(names_.shards[k]).filename().string();
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_bytes_}};
  index["weight_map"] = weight_map;
  // An older index at this path could name new shards beside old ones once
  // the renames below begin: it goes first.
  std::remove(names_.index.c_str());
  for (auto& shard : shards_) shard->commit();
  AtomicFile file(names_.index);
  file.write(index.dump(2) + "\n");
  file.commit();
  shards_.clear();
}

}  // namespace dpt
