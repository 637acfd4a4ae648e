#include "train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include "comm/agree.h"
#include "core/error.h"
#include "core/fault.h"
#include "device/host_staging.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace dpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "dptrain-checkpoint";
constexpr int kVersion = 1;

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

std::string file_name(int rank, int world) { return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, world); }

// Step of a "step-N" directory name, or -1.
int64_t step_of(const std::string& name) {
  static const std::regex re("step-([0-9]+)");
  std::smatch m;
  return std::regex_match(name, m, re) ? std::stoll(m[1]) : -1;
}

// A piece of one rank's file: elements [start, start + n) of a parameter
// (slot), of the parameters themselves (kind < 0) or of optimizer state
// tensor `kind`.
struct Piece {
  int kind;
  int slot;
  size_t start, n;
  float* data;           // parameters in RAM: where this rank keeps them
  Optimizer* optimizer;  // else its optimizer, from element `at` of its span
  size_t at;             // (read and written through its tier: it may be offloaded)
  // The optimizer's tensor: state `kind`, or for parameters its masters.
  size_t tensor() const { return kind < 0 ? optimizer->master_tensor() : static_cast<size_t>(kind); }
};

std::string kind_name(int kind, const std::vector<std::string>& state) {
  return kind < 0 ? "params" : state[static_cast<size_t>(kind)];
}

// A rank's spans cut at parameter boundaries, parameters first, then each
// state tensor: the tensors of its file, in file order. A piece's start is
// its place in the whole tensor: a tensor-parallel slice is cut into its
// runs of consecutive elements of the whole tensor (one piece each), so a
// checkpoint reads back at any tp. Without `replicated`, the tensors a
// tensor-parallel rank holds whole are left out (TP rank 0 writes them).
std::vector<Piece> pieces_of(const std::vector<StateSpan>& spans, const Layout& layout, size_t states,
                             bool replicated = true) {
  std::vector<Piece> out;
  for (int kind = -1; kind < static_cast<int>(states); ++kind)
    for (const StateSpan& sp : spans)
      for (size_t i = 0; i < layout.slots().size(); ++i) {
        const Slot& s = layout.slots()[i];
        const size_t lo = std::max(sp.begin, s.offset), hi = std::min(sp.begin + sp.n, s.offset + s.numel);
        if (lo >= hi || (!replicated && s.slice.parts == 1)) continue;
        const auto inner = static_cast<size_t>(s.slice.inner);
        for (size_t e = lo - s.offset; e < hi - s.offset;) {
          const size_t end = std::min(hi - s.offset, (e / inner + 1) * inner), in_span = s.offset + e - sp.begin;
          if (kind < 0 && sp.params)
            out.push_back({kind, static_cast<int>(i), s.slice.whole_index(e), end - e, sp.params + in_span, nullptr, 0});
          else  // optimizer state, or masters kept in the optimizer's tier
            out.push_back({kind, static_cast<int>(i), s.slice.whole_index(e), end - e, nullptr, sp.optimizer,
                           sp.at + in_span});
          e = end;
        }
      }
  return out;
}

std::vector<std::string> state_names_of(Strategy& strategy) {
  const auto spans = strategy.state_spans();
  return spans.empty() || !spans.front().optimizer ? std::vector<std::string>{}
                                                   : spans.front().optimizer->state_names();
}

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

// CRC-32s of a rank's file: of each piece (tensor), in file order, and of
// the whole data section (all bytes after the header), combined from them.
struct FileCrcs {
  uint32_t file = 0;
  std::vector<uint32_t> pieces;
};

FileCrcs write_rank_file(const std::string& path, const std::vector<Piece>& pieces, const Model& model,
                         const std::vector<std::string>& state, const std::map<std::string, std::string>& meta) {
  const Layout& layout = model.layout();
  std::vector<TensorSpec> specs;
  for (const Piece& p : pieces)
    specs.push_back({fmt::format("{}/{}/{}", kind_name(p.kind, state), layout.slots()[static_cast<size_t>(p.slot)].name,
                                 p.start),
                     DType::F32, {static_cast<int64_t>(p.n)}});
  SafetensorsWriter file(path, std::move(specs), meta);
  FileCrcs crcs;
  crcs.file = crc_update(0, nullptr, 0);
  // Everything reaches the file through one bounded host buffer (pinned on
  // a GPU): parameters downloaded from the model's device, optimizer state
  // (and offloaded masters) read out of its tier.
  HostStaging staged(model.k(), size_t{1} << 20);
  for (const Piece& p : pieces) {
    uint32_t c = crc_update(0, nullptr, 0);
    auto write = [&](const float* chunk, size_t k) {
      file.write(chunk, k);
      c = crc_update(c, chunk, k * sizeof(float));
    };
    if (p.data)
      staged.download(p.data, p.n, write);
    else
      staged.pass(
          p.n, [&](size_t done, size_t k, float* chunk) { p.optimizer->read_state(p.tensor(), p.at + done, k, chunk); },
          write);
    crcs.pieces.push_back(c);
    crcs.file = static_cast<uint32_t>(crc32_combine(crcs.file, c, static_cast<z_off_t>(p.n * sizeof(float))));
  }
  file.commit();
  return crcs;
}

// Every rank's piece CRC-32s, on every rank (an all-gather of equal slots:
// a count, then the CRCs, padded to the longest list).
std::vector<std::vector<uint32_t>> gather_piece_crcs(comm::ProcessGroup& pg, const std::vector<uint32_t>& mine) {
  float longest = static_cast<float>(mine.size());
  if (pg.size() > 1) pg.all_reduce(&longest, 1, DType::F32, comm::ReduceOp::Max);
  const size_t slot = static_cast<size_t>(longest) + 1;
  std::vector<uint32_t> all(slot * static_cast<size_t>(pg.size()), 0);
  uint32_t* at = all.data() + slot * static_cast<size_t>(pg.rank());
  at[0] = static_cast<uint32_t>(mine.size());
  std::copy(mine.begin(), mine.end(), at + 1);
  if (pg.size() > 1) pg.all_gather(all.data(), all.size(), DType::F32);  // 4-byte words, moved as bytes
  std::vector<std::vector<uint32_t>> out;
  for (int r = 0; r < pg.size(); ++r) {
    const uint32_t* p = all.data() + slot * static_cast<size_t>(r);
    out.emplace_back(p + 1, p + 1 + p[0]);
  }
  return out;
}

// A file's size against the manifest's. Returns the problem, or "".
std::string check_size(const std::string& path, uint64_t bytes) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return fmt::format("{}: missing: the checkpoint's manifest lists it", path);
  if (!fs::is_regular_file(path, ec)) return fmt::format("{}: not a file: the checkpoint's manifest lists a file", path);
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != bytes)
    return fmt::format("{}: {} bytes where the manifest says {}: the file is truncated or was replaced", path,
                       ec ? 0 : size, bytes);
  return "";
}

json manifest_json(const CheckpointInfo& info, const Layout& layout, const json& files) {
  json slots = json::array();
  for (const Slot& s : layout.slots())
    slots.push_back({{"name", s.name}, {"shape", s.whole_shape}, {"offset", s.offset},
                     {"numel", s.numel * static_cast<size_t>(s.slice.parts)}});
  return {{"format", kFormat},      {"version", kVersion},
          {"step", info.step},      {"model", info.model},
          {"optimizer", {{"name", info.optimizer}, {"state", info.state}, {"steps", info.step}}},
          {"settings", info.settings}, {"data", info.data},
          {"strategy", info.strategy}, {"world", info.world},
          {"parameters", slots},    {"files", files}};
}

// The newest complete checkpoint under dir ("" if none).
std::string newest_complete(const fs::path& dir) {
  int64_t best = -1;
  std::string name;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s > best && fs::exists(e.path() / "manifest.json")) {
      best = s;
      name = e.path().filename().string();
    }
  }
  return name;
}

// Removes leftovers of interrupted writes and all but the `keep` newest
// complete checkpoints (never `current`).
void prune(const fs::path& dir, int keep, const std::string& current) {
  std::vector<std::pair<int64_t, fs::path>> complete;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && (name.ends_with(".tmp") || name.ends_with(".old")) && step_of(name.substr(0, name.size() - 4)) >= 0)
      fs::remove_all(e.path(), ec);
    else if (const int64_t s = step_of(name); s >= 0 && fs::exists(e.path() / "manifest.json"))
      complete.push_back({s, e.path()});
  }
  if (keep <= 0 || complete.size() <= static_cast<size_t>(keep)) return;
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i)
    if (complete[i].second.filename() != current) fs::remove_all(complete[i].second, ec);
}

}  // namespace

namespace {

// The ranks of pg that write a file, in order. Files are numbered among the
// writers, so an hsdp checkpoint (its first shard group writes) is the
// checkpoint ZeRO-3 over one group's ranks writes.
std::vector<int> writing_ranks(comm::ProcessGroup& pg, const Strategy& strategy) {
  const int world = pg.size();
  std::vector<float> writes(static_cast<size_t>(world), 0.0f);
  writes[static_cast<size_t>(pg.rank())] = strategy.writes_state() ? 1.0f : 0.0f;
  if (world > 1) pg.all_gather(writes.data(), writes.size(), DType::F32);
  std::vector<int> writers;
  for (int r = 0; r < world; ++r)
    if (writes[static_cast<size_t>(r)] > 0.0f) writers.push_back(r);
  return writers;
}

// Rank 0 makes a written checkpoint exist: the manifest (every writer's file
// with its bytes and CRCs), the rename from tmp, `latest`, and the pruning of
// all but the `keep` newest. `sizes` holds each rank's file bytes and CRC.
void publish_checkpoint(const fs::path& root, const fs::path& tmp, CheckpointInfo complete, const Layout& layout,
                        const std::vector<int>& writers, const std::vector<double>& sizes,
                        const std::vector<std::vector<uint32_t>>& piece_crcs, int keep) {
  const int files_n = static_cast<int>(writers.size());
  json files = json::array();
  for (int f = 0; f < files_n; ++f) {
    const auto r = static_cast<size_t>(writers[static_cast<size_t>(f)]);
    files.push_back({{"name", file_name(f, files_n)},
                     {"bytes", static_cast<uint64_t>(sizes[2 * r])},
                     {"crc32", static_cast<uint32_t>(sizes[2 * r + 1])},
                     {"piece_crc32", piece_crcs[r]}});
  }
  complete.world = files_n;  // the ranks that wrote it
  AtomicFile manifest((tmp / "manifest.json").string());
  manifest.write(manifest_json(complete, layout, files).dump(1) + "\n");
  manifest.commit();  // fsyncs tmp, the directory holding the rank files
  const std::string step = step_name(complete.step);
  const fs::path final_dir = root / step, old = root / (step + ".old");
  if (fs::exists(final_dir)) fs::rename(final_dir, old);  // a rerun from an earlier checkpoint
  fs::rename(tmp, final_dir);
  fsync_directory(root.string());
  AtomicFile latest((root / "latest").string());
  latest.write(step + "\n");
  latest.commit();
  prune(root, keep, step);
}

}  // namespace

WrittenCheckpoint write_checkpoint(const std::string& dir, const CheckpointInfo& info, Strategy& strategy,
                             const Model& model, comm::ProcessGroup& pg, int keep, bool replicated,
                             const Model* whole) {
  const fs::path root(dir), final_dir = root / step_name(info.step), tmp = root / (step_name(info.step) + ".tmp");
  const int rank = pg.rank(), world = pg.size();
  std::string problem;
  if (rank == 0) try {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directory(tmp);
    } catch (const fs::filesystem_error& e) {
      problem = fmt::format("{}: cannot create the checkpoint directory: {}", tmp.string(), e.code().message());
    }
  comm::agree_on_error(pg, problem);

  // Every writing rank its own file, in parallel.
  const std::vector<int> writers = writing_ranks(pg, strategy);
  const int files_n = static_cast<int>(writers.size());
  const auto mine = std::find(writers.begin(), writers.end(), rank);
  const bool writer = mine != writers.end();
  const int index = static_cast<int>(mine - writers.begin());  // among the writers
  const std::string name = writer ? file_name(index, files_n) : "";
  const std::vector<std::string> state = state_names_of(strategy);
  FileCrcs crcs;
  if (writer) try {
      const auto pieces = pieces_of(strategy.state_spans(), model.layout(), state.size(), replicated);
      crcs = write_rank_file((tmp / name).string(), pieces, model, state,
                            {{"dpt.checkpoint.step", std::to_string(info.step)},
                             {"dpt.checkpoint.rank", std::to_string(index)},
                             {"dpt.checkpoint.world", std::to_string(files_n)}});
    } catch (const Error& e) {
      problem = e.what();
    }
  fault_point("checkpoint", info.step, rank);
  comm::agree_on_error(pg, problem);
  std::vector<double> sizes(2 * static_cast<size_t>(world), 0.0);
  if (writer) {
    sizes[2 * static_cast<size_t>(rank)] = static_cast<double>(fs::file_size(tmp / name));
    sizes[2 * static_cast<size_t>(rank) + 1] = static_cast<double>(crcs.file);
  }
  pg.all_gather(sizes.data(), sizes.size() * 2, DType::F32);  // doubles, moved as bytes
  const auto piece_crcs = gather_piece_crcs(pg, crcs.pieces);

  if (rank == 0) try {
      CheckpointInfo complete = info;
      complete.state = state;
      publish_checkpoint(root, tmp, complete, (whole ? *whole : model).layout(), writers, sizes, piece_crcs, keep);
    } catch (const Error& e) {
      problem = e.what();
    } catch (const fs::filesystem_error& e) {
      problem = fmt::format("{}: cannot complete the checkpoint: {}", final_dir.string(), e.code().message());
    }
  comm::agree_on_error(pg, problem);
  uint64_t bytes = 0;
  for (int r = 0; r < world; ++r) bytes += static_cast<uint64_t>(sizes[2 * static_cast<size_t>(r)]);  // 0: wrote none
  return {final_dir.string(), bytes};
}

std::string find_checkpoint(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::exists(p / "manifest.json", ec)) return p.string();
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    throw InputError(fmt::format("{}: a file, not a checkpoint directory (--resume takes a --checkpoint-dir or a "
                                 "step-N directory in it)",
                                 path));
  if (!fs::is_directory(p, ec)) throw InputError(fmt::format("{}: no such checkpoint directory", path));
  std::ifstream in(p / "latest");
  std::string name;
  if (in >> name && step_of(name) >= 0 && fs::exists(p / name / "manifest.json", ec)) return (p / name).string();
  // No pointer, or it names one that is gone (killed while replacing it):
  // the newest complete one.
  name = newest_complete(p);
  if (name.empty())
    throw InputError(fmt::format("{}: holds no complete checkpoint (no manifest.json in it or in a step-N below it)",
                                 path));
  return (p / name).string();
}

CheckpointInfo read_checkpoint_info(const std::string& checkpoint) {
  const std::string path = (fs::path(checkpoint) / "manifest.json").string();
  // A directory opens as a stream on Linux, and reading it throws
  // std::ios_base::failure, not a sentence.
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw IoError(fmt::format("{}: the checkpoint's manifest is not a file", path));
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot read the checkpoint's manifest", path));
  json j;
  try {
    in >> j;
  } catch (const json::exception&) {
    throw IoError(fmt::format("{}: the manifest is not valid JSON", path));
  }
  if (!j.is_object() || j.value("format", "") != kFormat)
    throw IoError(fmt::format("{}: not a dptrain checkpoint manifest", path));
  if (j.value("version", 0) != kVersion)
    throw IoError(fmt::format("{}: checkpoint format version {} (this dpt reads {})", path, j.value("version", 0),
                              kVersion));
  CheckpointInfo info;
  try {
    info.step = j.at("step").get<int64_t>();
    info.model = j.at("model").get<std::map<std::string, std::string>>();
    info.optimizer = j.at("optimizer").at("name").get<std::string>();
    info.state = j.at("optimizer").at("state").get<std::vector<std::string>>();
    info.settings = j.at("settings");
    info.data = j.at("data");
    info.strategy = j.at("strategy").get<std::string>();
    info.world = j.at("world").get<int>();
    if (info.step < 0 || info.world < 1 || !j.at("files").is_array() ||
        j.at("files").size() != static_cast<size_t>(info.world))
      throw IoError("");
    for (const json& p : j.at("parameters")) (void)p.at("name").get<std::string>();
    for (const json& f : j.at("files")) {
      (void)f.at("name").get<std::string>();
      (void)f.at("bytes").get<uint64_t>();
      (void)f.at("crc32").get<uint32_t>();
      (void)f.at("piece_crc32").get<std::vector<uint32_t>>();
    }
  } catch (const std::exception&) {
    throw IoError(fmt::format("{}: the manifest lacks a field or has a wrong one", path));
  }
  return info;
}

namespace {

// Refuses a checkpoint of another model, or of an optimizer that keeps other
// state, than this run's (the same answer on every rank: no agreement
// needed). Returns the state tensors' names.
std::vector<std::string> check_matches_run(const std::string& manifest_path, const CheckpointInfo& info,
                                           Strategy& strategy, const Model& model) {
  const auto mine = model.metadata();
  for (const auto& [k, v] : info.model)
    if (!mine.count(k) || mine.at(k) != v)
      throw InputError(fmt::format("{}: the checkpoint holds a model with {}={}, this run's has {}", manifest_path, k,
                                   v, mine.count(k) ? k + "=" + mine.at(k) : "no " + k));
  std::vector<std::string> state = state_names_of(strategy);
  if (info.state != state)
    throw InputError(fmt::format("{}: the checkpoint holds the state of {} ({}), this run's optimizer keeps {}",
                                 manifest_path, info.optimizer, fmt::join(info.state, ", "),
                                 state.empty() ? "none" : fmt::format("{}", fmt::join(state, ", "))));
  return state;
}

// What a rank reads: the layout's slots by name, the checkpoint's whole
// model's parameter names (another pipeline stage's are skipped), the state
// tensors' names, and the pieces of this rank's spans to fill.
struct ReadPlan {
  const Kernels& k;  // the model's device: parameters are uploaded to it
  const Layout& layout;
  std::map<std::string, int> slot_index;
  std::set<std::string> listed;
  const std::vector<std::string>& state;
  std::vector<Piece> targets;
};

// Tensor `ti` of a checkpoint file ("kind/slot/start") into the targets it
// overlaps. A piece any part of which this rank needs is read whole and
// checked against its CRC-32 before its parts are copied: the checkpoint is
// read once, and checked as it is read. Returns the values copied.
size_t read_piece(const SafetensorsReader& reader, size_t ti, uint32_t crc, const ReadPlan& plan,
                  std::vector<float>& piece) {
  const TensorSpec& spec = reader.tensors()[ti];
  const size_t a = spec.name.find('/'), b = spec.name.rfind('/');
  const std::string kind = spec.name.substr(0, a == std::string::npos ? 0 : a);
  const auto slot = a == b ? plan.slot_index.end() : plan.slot_index.find(spec.name.substr(a + 1, b - a - 1));
  const auto k = std::find(plan.state.begin(), plan.state.end(), kind);
  const int kind_i = kind == "params" ? -1 : static_cast<int>(k - plan.state.begin());
  size_t start = 0;
  try {
    start = std::stoull(spec.name.substr(b + 1));
  } catch (const std::exception&) {
    start = SIZE_MAX;
  }
  // (Within the whole tensor: a tensor-parallel slot is a slice of it.)
  // Another pipeline stage's parameter: its ranks read it.
  if (a != b && slot == plan.slot_index.end() && plan.listed.count(spec.name.substr(a + 1, b - a - 1))) return 0;
  const Slot* sl = slot == plan.slot_index.end() ? nullptr : &plan.layout.slots()[static_cast<size_t>(slot->second)];
  const size_t whole = sl ? sl->numel * static_cast<size_t>(sl->slice.parts) : 0;
  if (!sl || (kind != "params" && k == plan.state.end()) || spec.dtype != DType::F32 || spec.shape.size() != 1 ||
      start > whole || static_cast<size_t>(spec.shape[0]) > whole - start)
    throw IoError(fmt::format("{}: unexpected tensor '{}' for this model", reader.path(), spec.name));
  const size_t n = static_cast<size_t>(spec.shape[0]);
  bool loaded = false;
  size_t read = 0;
  for (const Piece& t : plan.targets) {
    if (t.kind != kind_i || t.slot != slot->second) continue;
    const size_t lo = std::max(start, t.start), hi = std::min(start + n, t.start + t.n);
    if (lo >= hi) continue;
    if (!loaded) {
      piece.resize(n);
      reader.read(spec.name, 0, n, piece.data());
      const uint32_t c = crc_update(crc_update(0, nullptr, 0), piece.data(), n * sizeof(float));
      if (c != crc)
        throw IoError(fmt::format("{}: checksum mismatch in tensor '{}' (CRC-32 {:08x}, the manifest says "
                                  "{:08x}): the file is corrupt",
                                  reader.path(), spec.name, c, crc));
      loaded = true;
    }
    if (t.data)
      plan.k.upload(t.data + (lo - t.start), piece.data() + (lo - start), (hi - lo) * sizeof(float));
    else
      t.optimizer->write_state(t.tensor(), t.at + (lo - t.start), hi - lo, piece.data() + (lo - start));
    read += hi - lo;
  }
  return read;
}

}  // namespace

uint64_t load_checkpoint(const std::string& checkpoint, const CheckpointInfo& info, Strategy& strategy,
                         const Model& model, comm::ProcessGroup& pg) {
  const fs::path dir(checkpoint);
  const std::string manifest_path = (dir / "manifest.json").string();
  const std::vector<std::string> state = check_matches_run(manifest_path, info, strategy, model);
  ReadPlan plan{model.k(), model.layout(), {}, {}, state, {}};
  json files;
  {
    std::ifstream in(manifest_path);
    const json manifest = json::parse(in);
    files = manifest.at("files");
    for (const json& p : manifest.at("parameters")) plan.listed.insert(p.at("name").get<std::string>());
  }
  std::string problem;
  for (const json& f : files)
    if (problem.empty())
      problem = check_size((dir / f.at("name").get<std::string>()).string(), f.at("bytes").get<uint64_t>());
  comm::agree_on_error(pg, problem);

  // Each rank reads the parts of every file's pieces that fall in its spans
  // (a bad piece ends the run before its first step, on every rank).
  for (size_t i = 0; i < plan.layout.slots().size(); ++i) plan.slot_index[plan.layout.slots()[i].name] = static_cast<int>(i);
  plan.targets = pieces_of(strategy.state_spans(), plan.layout, state.size());
  size_t wanted = 0, read = 0;
  for (const Piece& t : plan.targets) wanted += t.n;
  std::vector<float> piece;
  try {
    for (const json& f : files) {
      const SafetensorsReader reader((dir / f.at("name").get<std::string>()).string());
      const auto crcs = f.at("piece_crc32").get<std::vector<uint32_t>>();
      if (crcs.size() != reader.tensors().size())
        throw IoError(fmt::format("{}: holds {} tensors where the manifest lists {}", reader.path(),
                                  reader.tensors().size(), crcs.size()));
      for (size_t ti = 0; ti < reader.tensors().size(); ++ti) read += read_piece(reader, ti, crcs[ti], plan, piece);
    }
    if (read != wanted)
      throw IoError(fmt::format("{}: the files hold {} of the {} values this rank needs: a shard is missing or repeated",
                                checkpoint, read, wanted));
  } catch (const Error& e) {
    problem = e.what();
  }
  comm::agree_on_error(pg, problem);
  strategy.restored(info.step);
  uint64_t bytes = 0;
  for (const json& f : files) bytes += f.at("bytes").get<uint64_t>();
  return bytes;
}

}  // namespace dpt
