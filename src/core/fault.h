// Fault injection for the failure tests: DPT_FAULT="<point>:<step>:<rank>"
// kills this process with SIGKILL (as the kernel's OOM killer or a lost node
// would: no handler runs, nothing is flushed) when rank <rank> reaches
// <point> of step <step> (1-based). Points: forward, backward, reduce (the
// wait for gradient reductions), optimizer, checkpoint (this rank's file
// written, the checkpoint not yet complete). Unset, it costs a branch.
//
// DPT_STRAGGLE="<rank>:<ms>" makes rank <rank> sleep <ms> milliseconds at
// the start of every micro-batch's forward (the sequential executor's: not
// under --pp): a straggler on demand (what a slower or busier core makes of
// a rank), for the tests of the lock-step split (train/lockstep.h).
#pragma once

#include <cstdint>

namespace dpt {

void fault_point(const char* point, int64_t step, int rank);
void straggle_point(int rank);

}  // namespace dpt
