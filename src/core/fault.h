// Fault injection for the failure tests: DPT_FAULT="<point>:<step>:<rank>"
// kills this process with SIGKILL (as the kernel's OOM killer or a lost node
// would: no handler runs, nothing is flushed) when rank <rank> reaches
// <point> of step <step> (1-based). Points: forward, backward, reduce (the
// wait for gradient reductions), optimizer, checkpoint (this rank's file
// written, the checkpoint not yet complete). Unset, it costs a branch.
#pragma once

#include <cstdint>

namespace dpt {

void fault_point(const char* point, int64_t step, int rank);

}  // namespace dpt
