// A file that appears under its name only once complete: written to
// "<path>.tmp.<pid>", then flushed, fsynced and renamed by commit(). If the
// object dies uncommitted (an error, an exception), the temporary is removed
// and any older file at path is left untouched. Several files that must
// appear together (a sharded checkpoint, io/safetensors_set.h) are each
// seal()ed first, so every write has succeeded before any is renamed.
#pragma once

#include <cstdio>
#include <string>

namespace dpt {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // throws IoError if it cannot be created
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // throws IoError
  void write(const std::string& s) { write(s.data(), s.size()); }
  // Flush, fsync and close the temporary, which stays under its temporary
  // name (removed if this object dies uncommitted); throws IoError, having
  // removed it. No write() after it.
  void seal();
  void commit();  // seal() unless sealed, then rename; throws IoError

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool sealed_ = false;  // closed, the temporary complete on disk, not yet renamed
};

// Fails now, the way AtomicFile would at the end of a run, if `path` cannot
// be created: its directory is missing or not writable, or it names a
// directory. Creates and removes the temporary; leaves path untouched. A
// run checks its outputs with this before its first step, so hours of
// training are never lost to a typo in an output path.
void check_creatable(const std::string& path);

// Makes the entries of a directory (files created, renamed or removed in
// it) durable. Best effort: a failure loses nothing already written.
void fsync_directory(const std::string& dir);

}  // namespace dpt
