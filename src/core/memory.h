// Process memory as the OS sees it.
#pragma once

#include <cstddef>

namespace dpt {

// Peak resident set size of this process, in bytes.
size_t peak_rss_bytes();

}  // namespace dpt
