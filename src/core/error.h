// Errors in two tiers (gloo docs/errors.md):
//  - DPT_CHECK: an internal invariant. If it fails the engine has a bug; the
//    message names file and line.
//  - Error subclasses: things the user can cause or fix (bad input, a file
//    that is missing or corrupt). They reach the user as one sentence and a
//    non-zero exit from the `dpt` command.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dpt {

// Base of every error the engine throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user gave something the engine cannot use: a flag, a shape, a file.
class InputError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its contents are corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// An engine invariant failed: a bug, not a user mistake.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace dpt

#define DPT_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) ::dpt::fail_check(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
