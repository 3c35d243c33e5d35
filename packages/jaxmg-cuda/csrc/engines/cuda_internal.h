// What the CUDA files share (cuda_api.cc, cusolvermg.cc, cuda_targets.cc, cuda_testing.cc):
// the loaded API, vendor messages, the macro every vendor call goes through, and the two
// halves of the CUDA platform (backend.h): the participant's GPU and the leader's cuSolverMg.
// What has run on GPU hardware and what has not: see cuda_targets.cc.
#ifndef JAXMG_CUDA_INTERNAL_H_
#define JAXMG_CUDA_INTERNAL_H_

#include <dlfcn.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "base/backend.h"
#include "vendor/cuda_api.h"

namespace jaxmg {

using cuda::Api;

// The CUDA data type of an element type (cuSolverMg's and cuSOLVERMp's dataType/computeType).
inline cuda::cudaDataType CudaDataType(Dtype d) {
  switch (d) {
    case Dtype::kF32: return cuda::CUDA_R_32F;
    case Dtype::kF64: return cuda::CUDA_R_64F;
    case Dtype::kC64: return cuda::CUDA_C_32F;
    case Dtype::kC128: return cuda::CUDA_C_64F;
  }
  return cuda::CUDA_R_64F;
}

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

std::string VendorMessage(const Api* api, Library lib, int status);

// Every vendor call goes through this macro: a failure returns an Outcome naming the file,
// line, the call's text and the vendor's message (the protocol turns it into ffi::Error on
// every participant).
#define JAXMG_VENDOR_STATUS(lib, api, status, text)                                 \
  do {                                                                              \
    const int jaxmg_status_ = (status);                                             \
    if (jaxmg_status_ != 0) {                                                       \
      std::ostringstream jaxmg_m_;                                                  \
      jaxmg_m_ << __FILE__ << ":" << __LINE__ << ": " << text                       \
               << " failed: " << VendorMessage((api), Library::lib, jaxmg_status_); \
      return Outcome::Fail(jaxmg_m_.str());                                         \
    }                                                                               \
  } while (0)
#define JAXMG_VENDOR(lib, api, expr) JAXMG_VENDOR_STATUS(lib, api, (api)->expr, #expr)
#define JAXMG_CUDART(api, expr) JAXMG_VENDOR(kCudart, api, expr)
#define JAXMG_MG(api, expr) JAXMG_VENDOR(kCusolverMg, api, expr)

// Restores the calling thread's current device (the leader visits every device).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Api* api) : api_(api) { api_->cudaGetDevice(&device_); }
  ~DeviceGuard() { api_->cudaSetDevice(device_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const Api* api_;
  int device_ = 0;
};

// Memory that stays valid until the participant returns (XLA's scratch allocator in a handler),
// aligned to kScratchAlignment.
using ScratchFn = std::function<std::optional<void*>(size_t bytes)>;

// An allocator with the contract of XLA's FFI scratch allocator (ffi::ScratchAllocator::Allocate
// -> XLA_FFI_DeviceMemory_Allocate in xla/ffi/ffi_api.cc): it refuses an alignment that is not
// a power of two or exceeds kXlaMaxAlignment (its kMaxAlignment; the first H100 run refused 256
// even for 960 bytes), and otherwise returns memory aligned to at least what was asked.
using XlaAllocateFn = std::function<std::optional<void*>(size_t bytes, size_t alignment)>;
constexpr size_t kXlaMaxAlignment = 16;
// What jaxmg's device memory is aligned to, as cudaMalloc's (its workspaces, cuSOLVERMp's B).
constexpr size_t kScratchAlignment = 256;

// The ScratchFn of every CUDA handler (cuSolverMg and cuSOLVERMp), over `allocate`: it asks for
// kScratchAlignment more bytes at an alignment XLA accepts and aligns the start up itself.
ScratchFn AlignedScratch(XlaAllocateFn allocate);
// AlignedScratch over a handler's XLA allocator (which must outlive the function).
ScratchFn XlaScratch(ffi::ScratchAllocator& scratch);

// One participant's own GPU: everything runs on its XLA stream (cuda_targets.cc). With
// `api == nullptr` every use fails with `load_error`.
std::unique_ptr<Device> MakeCudaDevice(const Api* api, std::string load_error, cudaStream_t stream,
                                       int32_t ordinal, ScratchFn scratch);

// The leader's cuSolverMg calls for all devices (cusolvermg.cc).
std::unique_ptr<Backend> MakeCudaBackend(const Api* api);

}  // namespace jaxmg

#endif  // JAXMG_CUDA_INTERNAL_H_
