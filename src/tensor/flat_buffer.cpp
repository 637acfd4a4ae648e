#include "tensor/flat_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace dpt {

void FlatBuffer::Free::operator()(void* p) const { std::free(p); }

FlatBuffer::FlatBuffer(size_t numel, DType dtype) : dtype_(dtype) { reserve(numel); }

void FlatBuffer::reserve(size_t numel) {
  if (numel <= numel_ && data_) return;
  size_t bytes = (numel * dtype_size(dtype_) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  data_.reset(p);
  numel_ = numel;
}

void FlatBuffer::zero() {
  if (data_) std::memset(data_.get(), 0, bytes());
}

}  // namespace dpt
