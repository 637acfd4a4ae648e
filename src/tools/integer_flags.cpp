#include "tools/integer_flags.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace dpt {

namespace {

// "INT", "UINT" or another type, without the validators' descriptions
// that get_type_name appends ("INT:a positive number").
std::string base_type(const CLI::Option& opt) {
  const std::string t = opt.get_type_name();
  return t.substr(0, t.find(':'));
}

template <typename T>
std::string range_of() {
  return fmt::format("a whole number from {} to {}", std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
}

// Empty when `s` is a decimal whole number (s rewritten without its sign's
// "+" and leading zeros, which strtoll would read as octal); else what is
// wrong, for CLI11 to print after the flag's name. A number past T's range
// (T: 64 bits, the widest a flag's variable has) is CLI11's ConversionError,
// which integer_flag_error words with the variable's own range: strtoll
// would saturate it without a word.
template <typename T>
std::string whole_number(std::string& s, const std::string& flag) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  const std::string v = b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  const bool minus = !v.empty() && v[0] == '-';
  std::string digits = !v.empty() && (v[0] == '-' || v[0] == '+') ? v.substr(1) : v;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    char* end = nullptr;
    std::strtod(v.c_str(), &end);  // as the flags' own checks (flag_checks.h) tell a number
    return v.empty() || *end != '\0' ? fmt::format("'{}' is not a number", s)
                                     : fmt::format("'{}' is not a whole number (write it in decimal digits)", s);
  }
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
  const std::string canonical = (minus && digits != "0" ? "-" : "") + digits;
  T value{};
  const auto [end, ec] = std::from_chars(canonical.data(), canonical.data() + canonical.size(), value);
  if (ec != std::errc() || end != canonical.data() + canonical.size())
    throw CLI::ConversionError(flag, std::vector<std::string>{s});
  s = canonical;
  return {};
}

// Whether the option's variable holds 64 bits: whether 2^31 (2^32 for an
// unsigned one) converts into it, its checks set aside. Only on the way
// out: it writes the variable.
bool holds_64_bits(CLI::Option& opt, bool is_unsigned) {
  for (int i = 0;; ++i) try {
      opt.get_validator(i)->active(false);
    } catch (const CLI::OptionNotFound&) {
      break;
    }
  opt.clear();
  opt.add_result(is_unsigned ? "4294967296" : "2147483648");
  try {
    opt.run_callback();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void walk(CLI::App& app, std::vector<CLI::App*>& all) {
  all.push_back(&app);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) walk(*sub, all);
}

}  // namespace

void check_integer_flags(CLI::App& app) {
  std::vector<CLI::App*> apps;
  walk(app, apps);
  for (CLI::App* a : apps)
    for (CLI::Option* opt : a->get_options()) {
      if (opt->get_type_size() == 0) continue;  // a flag: no value
      const std::string type = base_type(*opt);
      // transform(): before the option's own checks, which read numbers
      // with strtod; no description, so --help stays as it was.
      const std::string flag = opt->get_name();
      if (type == "INT")
        opt->transform(CLI::Validator([flag](std::string& s) { return whole_number<int64_t>(s, flag); }, ""));
      else if (type == "UINT")
        opt->transform(CLI::Validator([flag](std::string& s) { return whole_number<uint64_t>(s, flag); }, ""));
    }
}

std::string integer_flag_error(CLI::App& app, const CLI::ConversionError& e) {
  // CLI11 2.1: "Could not convert: --tp = 4294967297".
  const std::string what = e.what(), head = "Could not convert: ";
  const size_t eq = what.find(" = ");
  if (!what.starts_with(head) || eq == std::string::npos) return {};
  const std::string name = what.substr(head.size(), eq - head.size()), value = what.substr(eq + 3);
  std::vector<CLI::App*> apps;
  walk(app, apps);
  for (CLI::App* a : apps) {
    if (!a->parsed()) continue;
    CLI::Option* opt = a->get_option_no_throw(name);
    if (opt == nullptr || opt->count() == 0) continue;
    const std::string type = base_type(*opt);
    if (type != "INT" && type != "UINT") return {};
    const bool wide = holds_64_bits(*opt, type == "UINT");
    const std::string range = type == "INT" ? (wide ? range_of<int64_t>() : range_of<int32_t>())
                                            : (wide ? range_of<uint64_t>() : range_of<uint32_t>());
    return fmt::format("{}: {} is out of range ({})", name, value, range);
  }
  return {};
}

}  // namespace dpt
