// The CUDA platform of the FFI handlers (ffi/handlers.cc): a participant's own GPU, on XLA's
// stream, and the leader's cuSolverMg (engines/cusolvermg.cc).
// What has run on GPU hardware: docs/gpu.md. In CI (no GPU) this layer compiles, its lowering
// is tested on CPU and its body runs against an emulator of the CUDA runtime and cuSolverMg (RunCudaOnHost, testing/cuda_testing.cc; tests/native/fake_cuda).
#include "platforms/cuda_targets.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/common.h"
#include "engines/cuda_internal.h"
#include "engines/cusolvermg.h"
#include "meeting/protocol.h"
#include "platforms/platforms.h"
#include "vendor/cuda_api.h"

namespace jaxmg {
namespace {

// One participant's own GPU: everything runs on its XLA stream.
class CudaDevice final : public Device {
 public:
  CudaDevice(const Api* api, std::string load_error, cudaStream_t stream, int32_t ordinal,
             ScratchFn scratch)
      : api_(api),
        load_error_(std::move(load_error)),
        stream_(stream),
        ordinal_(ordinal),
        scratch_(std::move(scratch)) {}

  int ordinal() const override { return ordinal_; }
  Outcome ReadPosition(const int32_t* src, int32_t* out) override {
    if (api_ == nullptr) return Outcome::Fail(load_error_);
    JAXMG_CUDART(api_, cudaSetDevice(ordinal_));
    JAXMG_CUDART(api_,
                 cudaMemcpyAsync(out, src, sizeof(int32_t), cuda::cudaMemcpyDeviceToHost, stream_));
    JAXMG_CUDART(api_, cudaStreamSynchronize(stream_));
    return {};
  }
  Outcome Copy(void* dst, const void* src, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemcpyAsync(dst, src, bytes, cuda::cudaMemcpyDefault, stream_));
    return {};
  }
  Outcome Upload(void* dst, const void* host, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemcpyAsync(dst, host, bytes, cuda::cudaMemcpyHostToDevice, stream_));
    return {};
  }
  Outcome FillBytes(void* dst, int byte, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemsetAsync(dst, byte, bytes, stream_));
    return {};
  }
  Outcome Allocate(size_t bytes, void** out) override {
    std::optional<void*> memory = scratch_(bytes);
    if (!memory.has_value())
      return Outcome::Fail("XLA's scratch allocator could not provide it on GPU " +
                           std::to_string(ordinal_));
    *out = *memory;
    return {};
  }
  Outcome Synchronize() override {
    JAXMG_CUDART(api_, cudaStreamSynchronize(stream_));
    return {};
  }

  // The allocation that holds `data` (XLA's allocator
  // sub-allocates, hence the offset) as a CUDA IPC handle, and this GPU's PCI bus id.
  bool SharesByHandle() const override { return true; }
  Outcome Share(void* data, size_t bytes, SharedMemory* out) override {
    if (api_ == nullptr) return Outcome::Fail(load_error_);
    if (api_->cuPointerGetAttribute == nullptr)
      return Outcome::Fail("the CUDA driver's cuPointerGetAttribute was not found (libcuda.so.1)");
    const auto address = reinterpret_cast<cuda::CUdeviceptr>(data);
    JAXMG_CUDART(api_, cudaSetDevice(ordinal_));  // a current context for the driver's queries
    int capable = 0;
    cuda::CUdeviceptr base = 0;
    size_t range = 0;
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&capable, cuda::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                    address),
        "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)");
    if (capable == 0)
      return Outcome::Fail(
          "XLA's allocator gave a buffer that CUDA IPC cannot share "
          "(not a cudaMalloc-style allocation); the multi-process mode on GPUs "
          "needs XLA's default (BFC) allocator");
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&base, cuda::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address),
        "cuPointerGetAttribute(RANGE_START_ADDR)");
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&range, cuda::CU_POINTER_ATTRIBUTE_RANGE_SIZE, address),
        "cuPointerGetAttribute(RANGE_SIZE)");
    if (address < base || address - base + bytes > range)
      return Outcome::Fail("a buffer of " + std::to_string(bytes) +
                           " bytes does not lie in "
                           "one allocation");
    // The GPU that holds the memory, as the driver sees it (not XLA's numbering of devices).
    int holder = ordinal_;
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&holder, cuda::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address),
        "cuPointerGetAttribute(DEVICE_ORDINAL)");
    cuda::cudaIpcMemHandle_t handle;
    if (holder != ordinal_) JAXMG_CUDART(api_, cudaSetDevice(holder));
    JAXMG_CUDART(api_, cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)));
    std::memcpy(out->handle, handle.reserved, sizeof(out->handle));
    out->offset = address - base;
    out->bytes = bytes;
    JAXMG_CUDART(api_, cudaDeviceGetPCIBusId(out->bus_id, sizeof(out->bus_id), holder));
    return {};
  }

 private:
  const Api* api_;
  std::string load_error_;
  cudaStream_t stream_;
  int32_t ordinal_;
  ScratchFn scratch_;
};

}  // namespace

void SetCudaLibraryDirs(const std::vector<std::string>& dirs) { cuda::SetLibraryDirs(dirs); }

bool LoadCudaLibraries(std::string* error) { return cuda::Load(error) != nullptr; }

ScratchFn AlignedScratch(XlaAllocateFn allocate) {
  return [allocate = std::move(allocate)](size_t bytes) -> std::optional<void*> {
    std::optional<void*> memory = allocate(bytes + kScratchAlignment, kXlaMaxAlignment);
    if (!memory.has_value() || *memory == nullptr) return std::nullopt;
    const auto at = reinterpret_cast<uintptr_t>(*memory);
    return reinterpret_cast<void*>((at + kScratchAlignment - 1) / kScratchAlignment *
                                   kScratchAlignment);
  };
}

ScratchFn XlaScratch(ffi::ScratchAllocator& scratch) {
  return AlignedScratch([&scratch](size_t bytes, size_t alignment) {
    return scratch.Allocate(bytes, alignment);
  });
}

std::unique_ptr<Device> MakeCudaDevice(const Api* api, std::string load_error, cudaStream_t stream,
                                       int32_t ordinal, ScratchFn scratch) {
  return std::make_unique<CudaDevice>(api, std::move(load_error), stream, ordinal,
                                      std::move(scratch));
}

ffi::Error RunOnCuda(const Operands& o, cudaStream_t stream, int32_t ordinal,
                     ffi::ScratchAllocator& scratch) {
  std::string load_error;
  const Api* api = cuda::Load(&load_error);
  std::unique_ptr<Device> device =
      MakeCudaDevice(api, load_error, stream, ordinal, XlaScratch(scratch));
  std::unique_ptr<Backend> backend = MakeCudaBackend(api);
  return Participate(o, *device, *backend, kMaxCudaDevices);
}

}  // namespace jaxmg
