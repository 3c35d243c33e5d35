// The LAPACK twin: the library of the CPU backend (platforms/cpu_twin.cc), one function per step.
#ifndef JAXMG_LAPACK_TWIN_H_
#define JAXMG_LAPACK_TWIN_H_

#include <cstdint>
#include <string>

#include "base/backend.h"

namespace jaxmg {

// Register one LAPACK routine by its scipy name (e.g. "dpotrf").
void RegisterLapack(const std::string& name, void* fn);

// Bytes of workspace the call needs at mesh position 0 (the other positions need none).
Outcome LapackWorkspaceBytes(const MgCall& call, int64_t* bytes);

// The call's steps (call.routine) on all positions' tiles; `info` is LAPACK's.
Outcome LapackRun(const MgCall& call, int* info);

}  // namespace jaxmg

#endif  // JAXMG_LAPACK_TWIN_H_
