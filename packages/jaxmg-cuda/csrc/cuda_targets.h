#ifndef JAXMG_CUDA_TARGETS_H_
#define JAXMG_CUDA_TARGETS_H_

#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxmg {
void SetCudaLibraryDirs(const std::vector<std::string>& dirs);
// Opens the libraries (once); false with `error` saying what was tried.
bool LoadCudaLibraries(std::string* error);
}  // namespace jaxmg

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotrsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotriCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgSyevdCuda);

#endif  // JAXMG_CUDA_TARGETS_H_
