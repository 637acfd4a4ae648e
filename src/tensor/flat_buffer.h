// One aligned allocation of elements, on the CPU or on a GPU. Parameters,
// gradients, optimizer moments and activations each live in one; layers get
// raw pointers into it, so a training step allocates nothing.
#pragma once

#include <cstddef>
#include <memory>

#include "core/dtype.h"
#include "device/kernels.h"

namespace dpt {

class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(size_t numel, DType dtype = DType::F32, Device device = Device::CPU);
  // numel elements in CPU memory someone else allocated (a shared window,
  // comm::ProcessGroup::shared_memory), kept alive by the buffer. Growing
  // such a buffer past numel moves it to memory of its own.
  FlatBuffer(std::shared_ptr<void> memory, size_t numel, DType dtype = DType::F32);

  // Where the elements live; moves them there if any are allocated (between
  // the CPU and a GPU). Pointers from f32()/b16() are that device's.
  void place(Device device);
  Device device() const { return device_; }
  // Grows (never shrinks) to at least numel elements, zero-filled.
  void reserve(size_t numel);
  void zero();

  float* f32() { return reinterpret_cast<float*>(data_.get()); }
  const float* f32() const { return reinterpret_cast<const float*>(data_.get()); }
  bf16* b16() { return reinterpret_cast<bf16*>(data_.get()); }
  const bf16* b16() const { return reinterpret_cast<const bf16*>(data_.get()); }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }

 private:
  struct Free {
    Free() : device(Device::CPU) {}
    explicit Free(Device d) : device(d) {}
    explicit Free(std::shared_ptr<void> o) : device(Device::CPU), owner(std::move(o)) {}
    void operator()(void* p) const;
    Device device;
    std::shared_ptr<void> owner;  // set: the memory is its, not ours to free
  };
  std::unique_ptr<void, Free> data_;
  size_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace dpt
