// Loads the CUDA backend (device/cuda_backend.h) the first time a GPU is asked for.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "device/cuda_backend.h"

namespace dpt::cuda {

namespace {

// Where libdpt_cuda.so may be: DPT_CUDA_MODULE, the build's own copy, beside
// the running program, then the loader's search path.
std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* e = std::getenv("DPT_CUDA_MODULE")) c.emplace_back(e);
#ifdef DPT_CUDA_MODULE_PATH
  c.emplace_back(DPT_CUDA_MODULE_PATH);
#endif
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    c.push_back(dir + "/libdpt_cuda.so");
    c.push_back(dir + "/../libdpt_cuda.so");
  }
  c.emplace_back("libdpt_cuda.so");
  return c;
}

const Backend* load() {
  if (!cuda_built())
    throw InputError("this dpt was built without CUDA (no CUDA toolkit found, or -DDPT_CUDA=OFF)");
  std::string why;
  for (const std::string& path : candidates()) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      if (why.empty() || access(path.c_str(), F_OK) == 0) why = ::dlerror();
      continue;
    }
    auto entry = reinterpret_cast<const Backend* (*)()>(::dlsym(h, "dpt_cuda_backend"));
    if (!entry) {
      why = fmt::format("{} has no dpt_cuda_backend", path);
      continue;
    }
    const Backend* b = entry();
    if (b->abi != kBackendAbi) {
      why = fmt::format("{} is of another build (interface {}, expected {})", path, b->abi, kBackendAbi);
      continue;
    }
    return b;
  }
  throw InputError(fmt::format("no CUDA device: the CUDA backend could not be loaded ({})", why));
}

}  // namespace

const Backend& backend() {
  static std::mutex mu;
  static const Backend* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) loaded = load();  // a failure is reported again on the next call
  return *loaded;
}

}  // namespace dpt::cuda
