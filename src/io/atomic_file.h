// A file that appears under its name only once complete: written to
// "<path>.tmp.<pid>", then flushed, fsynced and renamed by commit(). If the
// object dies uncommitted (an error, an exception), the temporary is removed
// and any older file at path is left untouched.
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
  void flush();   // to the OS, so a reader of the temporary sees progress
  void commit();  // fsync + rename; throws IoError

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
};

}  // namespace dpt
