// Where a participant runs: each platform's implementation of base/backend.h, behind one call.
#ifndef JAXMG_PLATFORMS_H_
#define JAXMG_PLATFORMS_H_

#include <cstdint>

#include <xla/ffi/api/ffi.h>

#include "base/operands.h"
#include "vendor/cuda_api.h"

namespace jaxmg {

// The CPU twin (cpu_twin.cc): LAPACK on the leader's thread. Asynchronous: the future
// completes once the leader is done (meeting/protocol.h, ParticipateWithoutWaiting).
ffi::Future RunOnCpu(const Operands& operands);

// cuSolverMg (cuda_targets.cc): this participant's GPU `ordinal`, on XLA's `stream`.
ffi::Error RunOnCuda(const Operands& operands, cudaStream_t stream, int32_t ordinal,
                     ffi::ScratchAllocator& scratch);

}  // namespace jaxmg

#endif  // JAXMG_PLATFORMS_H_
