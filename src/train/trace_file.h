// The writing half of a run's timeline (core/timeline.h): `dpt train
// --trace-out` as a Chrome trace (open it in https://ui.perfetto.dev or
// chrome://tracing; bench/plot_timeline.py draws it as an SVG), one process
// per rank, so overlap of communication with backward is visible.
#pragma once

#include "comm/process_group.h"
#include "core/timeline.h"
#include "io/atomic_file.h"

namespace dpt {

// Collective: gathers every rank's spans to rank 0, which writes the Chrome
// trace JSON into `out` and commits it (the caller opens it before training,
// so a bad path fails at once).
void write_trace(const Timeline& timeline, AtomicFile* out, comm::ProcessGroup& pg);

}  // namespace dpt
