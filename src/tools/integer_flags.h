// Whole-number flags, checked once for every command: CLI11 2.1 reads them
// with strtoll / strtoull in base 0 and does not look at errno, so
// --steps 99999999999999999999 became 2^63 - 1 steps (a run that never
// ends), --seed -1 became 2^64 - 1, --steps 010 was 8 steps (octal), and a
// 32-bit flag past its range said only "Could not convert: --tp = ...".
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace dpt {

// Adds to every option of `app` and its subcommands that takes a whole
// number (CLI11's type INT or UINT) a check that the value is written in
// decimal digits (a sign allowed) and fits 64 bits, handing CLI11 the
// number without leading zeros; a value that is no whole number is refused
// in one sentence, one past 64 bits is CLI11's ConversionError.
void check_integer_flags(CLI::App& app);

// For CLI11's ConversionError of a whole-number flag (past 64 bits, or past
// the flag's variable's narrower type), the sentence naming the flag and
// the variable's range: "--tp: 4294967297 is out of range (a whole number
// from -2147483648 to 2147483647)". Empty for any other conversion error.
// Call it only on the way out: finding the range writes the variable.
std::string integer_flag_error(CLI::App& app, const CLI::ConversionError& e);

}  // namespace dpt
