// The CUDA libraries, as the Python package points jaxmg_cuda at them.
#ifndef JAXMG_CUDA_TARGETS_H_
#define JAXMG_CUDA_TARGETS_H_

#include <string>
#include <vector>

namespace jaxmg {
void SetCudaLibraryDirs(const std::vector<std::string>& dirs);
// Opens the libraries (once); false with `error` saying what was tried.
bool LoadCudaLibraries(std::string* error);
}  // namespace jaxmg

#endif  // JAXMG_CUDA_TARGETS_H_
