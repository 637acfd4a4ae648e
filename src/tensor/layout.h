// Where every named tensor of a model lives inside one flat buffer.
//
// Parameters, gradients and optimizer state are each one allocation; a
// Layout maps names to {shape, offset} inside it (llm.c's
// malloc_and_point_parameters). Slots are grouped into units (an embedding,
// one transformer block, a head), which are contiguous ranges, so a DDP
// bucket is a range of the buffer and a ZeRO shard a slice of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dpt {

// Where a slot's elements sit in the whole tensor of its name when the slot
// holds a slice of it (a tensor-parallel rank's share; models/decoder.h): the
// whole tensor seen as [outer, parts, inner], the slot as part `part` of it
// ([outer, inner]). A slot holding its whole tensor is {1, 1, 0, numel}.
struct TensorSlice {
  int64_t outer = 1, parts = 1, part = 0, inner = 0;
  // Element i of the slot is element whole_index(i) of the whole tensor.
  size_t whole_index(size_t i) const {
    const auto in = static_cast<size_t>(inner);
    return (i / in * static_cast<size_t>(parts) + static_cast<size_t>(part)) * in + i % in;
  }
};

struct Slot {
  std::string name;            // PyTorch's name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // PyTorch's layout: Linear weights are [out, in]
  size_t offset = 0;           // in elements from the start of the buffer
  size_t numel = 0;
  int unit = 0;                // index into Layout::units()
  bool decay = false;          // AdamW weight decay applies (matrices only)
  // The whole tensor (what weight files hold) and this slot's part of it;
  // whole_shape == shape and slice.parts == 1 unless the slot is a slice.
  std::vector<int64_t> whole_shape;
  TensorSlice slice;
};

struct Unit {
  std::string name;  // e.g. "transformer.h.0"
  size_t offset = 0;
  size_t numel = 0;
  int first_slot = 0;
  int slot_count = 0;
};

class Layout {
 public:
  // Starts a new unit; the slots added next belong to it.
  void begin_unit(const std::string& name);
  // Appends a slot at the end of the buffer and returns its index. With a
  // slice (parts > 1), the slot is that part of a tensor of whole_shape.
  int add(const std::string& name, std::vector<int64_t> shape, bool decay, TensorSlice slice = {},
          std::vector<int64_t> whole_shape = {});

  const std::vector<Slot>& slots() const { return slots_; }
  const std::vector<Unit>& units() const { return units_; }
  const Slot& slot(int i) const { return slots_.at(static_cast<size_t>(i)); }
  // Index of the slot with this name, or -1.
  int find(const std::string& name) const;
  size_t numel() const { return numel_; }

 private:
  std::vector<Slot> slots_;
  // find's index: a linear search made building a model quadratic in its
  // slots (10,000 blocks took 47 s before the memory check could refuse them).
  std::unordered_map<std::string, int> index_;
  std::vector<Unit> units_;
  size_t numel_ = 0;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[3, 4]"

}  // namespace dpt
