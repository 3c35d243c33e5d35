// What the loader (vendor/cuda_api.cc) offers beyond cuda_api.h: opening further NVIDIA
// libraries the same way (cuSOLVERMp and NCCL, engines/cusolvermp.cc), binding their symbols,
// and the vendors' status codes as messages.
#ifndef JAXMG_LOADER_H_
#define JAXMG_LOADER_H_

#include <dlfcn.h>

#include <string>

#include "vendor/cuda_api.h"

namespace jaxmg {

namespace cuda {
// Looks `name` up in `lib` into `slot`; a missing name is appended to `missing`.
template <typename Slot>
void Bind(void* lib, const char* name, Slot& slot, std::string* missing) {
  void* symbol = lib != nullptr ? dlsym(lib, name) : nullptr;
  if (symbol == nullptr) *missing += std::string(" ") + name;
  slot = reinterpret_cast<Slot>(symbol);
}

// Why libraries did not open, one "\n  what: reason" line each: those not found anywhere, and
// those found that the dynamic loader could not load (its reason: a missing dependency, an
// undefined symbol, another architecture).
struct OpenFailures {
  std::string not_found;
  std::string unloadable;
};

// Opens a library by soname from the folders the package set (SetCudaLibraryDirs), else the
// loader's path, RTLD_NOW | RTLD_GLOBAL; nullptr with the reason added to `failures`.
void* OpenLibrary(const std::string& name, OpenFailures* failures);
// What `failures` holds, for an error message: the libraries found but not loadable (with the
// loader's reasons), then those not found.
std::string DescribeFailures(const OpenFailures& failures);
}  // namespace cuda

const char* CusolverStatusName(int status);

enum class Library { kCudart, kCusolverMg, kDriver };

std::string VendorMessage(const cuda::Api* api, Library lib, int status);

}  // namespace jaxmg

#endif  // JAXMG_LOADER_H_
