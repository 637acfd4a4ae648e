// Checks before reading a path the user gave as a file.
#pragma once

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

// Refuses a directory where a file is to be read: Linux opens a directory as
// a stream, and reading it then throws std::ios_base::failure
// ("basic_filebuf::underflow error reading the file: Is a directory"), which
// is no sentence and names no path.
inline void refuse_directory(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw IoError(fmt::format("{}: a directory, not {}", path, what));
}

}  // namespace dpt
