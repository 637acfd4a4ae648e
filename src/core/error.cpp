#include "core/error.h"

namespace dpt {

void fail_check(const char* expr, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("internal check failed at {}:{}: {}{}{}", file, line, expr,
                                  msg.empty() ? "" : ": ", msg));
}

}  // namespace dpt
