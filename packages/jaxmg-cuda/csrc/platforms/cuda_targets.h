// The CUDA platform (cuda_targets.cc): the libraries, as the Python package points jaxmg_cuda
// at them, a participant's own GPU, and the scratch memory of XLA's allocator.
#ifndef JAXMG_CUDA_TARGETS_H_
#define JAXMG_CUDA_TARGETS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <xla/ffi/api/ffi.h>

#include "base/backend.h"
#include "engines/cuda_internal.h"
#include "vendor/cuda_api.h"

namespace jaxmg {
void SetCudaLibraryDirs(const std::vector<std::string>& dirs);
// Opens the libraries (once); false with `error` saying what was tried.
bool LoadCudaLibraries(std::string* error);

// An allocator with the contract of XLA's FFI scratch allocator (ffi::ScratchAllocator::Allocate
// -> XLA_FFI_DeviceMemory_Allocate in xla/ffi/ffi_api.cc): it refuses an alignment that is not
// a power of two or exceeds kXlaMaxAlignment (its kMaxAlignment; the first H100 run refused 256
// even for 960 bytes), and otherwise returns memory aligned to at least what was asked.
using XlaAllocateFn = std::function<std::optional<void*>(size_t bytes, size_t alignment)>;
constexpr size_t kXlaMaxAlignment = 16;

// The ScratchFn of every CUDA handler (cuSolverMg and cuSOLVERMp), over `allocate`: it asks for
// kScratchAlignment more bytes at an alignment XLA accepts and aligns the start up itself.
ScratchFn AlignedScratch(XlaAllocateFn allocate);
// AlignedScratch over a handler's XLA allocator (which must outlive the function).
ScratchFn XlaScratch(ffi::ScratchAllocator& scratch);

// One participant's own GPU: everything runs on its XLA stream. With `api == nullptr` every
// use fails with `load_error`.
std::unique_ptr<Device> MakeCudaDevice(const Api* api, std::string load_error, cudaStream_t stream,
                                       int32_t ordinal, ScratchFn scratch);
}  // namespace jaxmg

#endif  // JAXMG_CUDA_TARGETS_H_
