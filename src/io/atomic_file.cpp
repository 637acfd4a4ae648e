#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace dpt {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw IoError(fmt::format("{}: cannot create file: {}", path_, std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (f_ || sealed_) std::remove(tmp_.c_str());
}

void check_creatable(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw IoError(fmt::format("{}: cannot create file: it is a directory", path));
  AtomicFile probe(path);  // removes its temporary when it goes out of scope
}

void AtomicFile::write(const void* data, size_t n) {
  DPT_CHECK(f_, "{}: write() after seal() or commit()", path_);
  if (n && std::fwrite(data, 1, n, f_) != n)
    throw IoError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

void AtomicFile::seal() {
  bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (!ok) {
    std::remove(tmp_.c_str());
    throw IoError(fmt::format("{}: cannot write file: {}", path_, std::strerror(err)));
  }
  sealed_ = true;
}

void AtomicFile::commit() {
  if (!sealed_) seal();
  sealed_ = false;  // renamed, or removed below: nothing left for the destructor
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    throw IoError(fmt::format("{}: cannot write file: {}", path_, std::strerror(err)));
  }
  fsync_directory(std::filesystem::path(path_).parent_path().string());  // the rename itself
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace dpt
