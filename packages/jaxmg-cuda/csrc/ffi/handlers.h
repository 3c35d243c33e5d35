// The FFI targets of every routine (handlers.cc), as the bindings register them with XLA.
#ifndef JAXMG_HANDLERS_H_
#define JAXMG_HANDLERS_H_

#include <string>
#include <vector>

namespace jaxmg {

// An FFI target: its name and the handlers of its stages (XLA_FFI_Handler*), `instantiate`
// (instance.h) or nullptr for none.
struct Target {
  std::string name;
  void* instantiate;
  void* execute;
};

// Every routine's FFI target for the CPU twin, or for CUDA (none when built without CUDA).
std::vector<Target> Targets(bool cuda);
// Backend "mp": jaxmg_mp_<name>, on CPUs (ScaLAPACK over MPI, engines/scalapack.h) or on CUDA
// (cuSOLVERMp over NCCL, engines/cusolvermp.h; none when built without CUDA).
std::vector<Target> MpTargets(bool cuda);

}  // namespace jaxmg

#endif  // JAXMG_HANDLERS_H_
