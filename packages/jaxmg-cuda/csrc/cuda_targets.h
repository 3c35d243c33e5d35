#ifndef JAXMG_CUDA_TARGETS_H_
#define JAXMG_CUDA_TARGETS_H_

#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxmg {
void SetCudaLibraryDirs(const std::vector<std::string>& dirs);
// Opens the libraries (once); false with `error` saying what was tried.
bool LoadCudaLibraries(std::string* error);
// What cuSolverMg does with a device list naming `device` twice (a report line; for the GPU
// validation run, see cuda_targets.cc).
std::string ProbeRepeatedGpu(int device);
}  // namespace jaxmg

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotrsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotriCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgSyevdCuda);

#endif  // JAXMG_CUDA_TARGETS_H_
