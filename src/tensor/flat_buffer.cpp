#include "tensor/flat_buffer.h"

#include <algorithm>

#include "core/error.h"

namespace dpt {

void FlatBuffer::Free::operator()(void* p) const {
  if (!owner) kernels(device).free(p);
}

FlatBuffer::FlatBuffer(size_t numel, DType dtype, Device device) : dtype_(dtype), device_(device) {
  reserve(numel);
}

FlatBuffer::FlatBuffer(std::shared_ptr<void> memory, size_t numel, DType dtype)
    : data_(memory.get(), Free{memory}), numel_(numel), dtype_(dtype), device_(Device::CPU) {}

void FlatBuffer::place(Device device) {
  if (device == device_) return;
  if (!data_) {
    device_ = device;
    return;
  }
  // Moves the elements: one side is always the CPU (no GPU-to-GPU moves).
  DPT_CHECK(device_ == Device::CPU || device == Device::CPU, "a buffer moved from {} to {}", device_name(device_),
            device_name(device));
  const size_t n = numel_, b = bytes();
  std::unique_ptr<void, Free> moved(kernels(device).alloc(std::max<size_t>(b, 64)), Free{device});
  if (device == Device::CPU)
    kernels(device_).download(moved.get(), data_.get(), b);
  else
    kernels(device).upload(moved.get(), data_.get(), b);
  data_ = std::move(moved);
  numel_ = n;
  device_ = device;
}

void FlatBuffer::reserve(size_t numel) {
  if (numel <= numel_ && data_) return;
  // 64-byte multiples (and at least 64), so views cut from it stay aligned.
  size_t bytes = (numel * dtype_size(dtype_) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  // Free the old block first: a buffer that grows never holds both.
  data_.reset();
  numel_ = 0;
  data_ = std::unique_ptr<void, Free>(kernels(device_).alloc(bytes), Free{device_});
  numel_ = numel;
}

void FlatBuffer::zero() {
  if (data_) kernels(device_).zero(data_.get(), bytes());
}

}  // namespace dpt
