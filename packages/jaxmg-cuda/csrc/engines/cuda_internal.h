// What the CUDA engines (cusolvermg.cc, cusolvermp.cc) share with the CUDA platform
// (platforms/cuda_targets.cc) and its test entry point (testing/cuda_testing.cc): the loaded
// API, the element types, the macro every vendor call goes through, the device guard and the
// scratch memory they are given. What has run on GPU hardware and what has not: see
// platforms/cuda_targets.cc.
#ifndef JAXMG_CUDA_INTERNAL_H_
#define JAXMG_CUDA_INTERNAL_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <sstream>

#include "base/common.h"
#include "base/outcome.h"
#include "vendor/cuda_api.h"
#include "vendor/loader.h"

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

// Memory that stays valid until the participant returns (XLA's scratch allocator in a handler:
// platforms/cuda_targets.h, XlaScratch), aligned to kScratchAlignment.
using ScratchFn = std::function<std::optional<void*>(size_t bytes)>;
// What jaxmg's device memory is aligned to, as cudaMalloc's (its workspaces, cuSOLVERMp's B).
constexpr size_t kScratchAlignment = 256;

}  // namespace jaxmg

#endif  // JAXMG_CUDA_INTERNAL_H_
