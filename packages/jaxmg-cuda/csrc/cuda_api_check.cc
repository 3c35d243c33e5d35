// Compiled only when CMake finds real CUDA headers: our own declarations in cuda_api.h must
// match them. Enum values are compared exactly; functions by arity and by the size of the
// return type and of every parameter (our enums are distinct C++ types, so the function types
// cannot be compared directly). Nothing here is linked into the module.
#include <cstddef>
#include <type_traits>

#include "cuda_api.h"

namespace c = jaxmg::cuda;

template <typename A, typename B>
struct SameShape : std::false_type {};
template <typename R1, typename... A1, typename R2, typename... A2>
struct SameShape<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool Sizes() {
    if constexpr (sizeof...(A1) != sizeof...(A2)) {
      return false;
    } else {
      return ((sizeof(A1) == sizeof(A2)) && ... && true);
    }
  }
  static constexpr bool value = sizeof(R1) == sizeof(R2) && Sizes();
};

#define JAXMG_SAME_SHAPE(fn)                                                     \
  static_assert(SameShape<decltype(&::fn), decltype(c::Api::fn)>::value,         \
                #fn ": cuda_api.h does not match the real header")

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#include <library_types.h>

static_assert(static_cast<int>(::CUDA_R_32F) == c::CUDA_R_32F);
static_assert(static_cast<int>(::CUDA_R_64F) == c::CUDA_R_64F);
static_assert(static_cast<int>(::CUDA_C_32F) == c::CUDA_C_32F);
static_assert(static_cast<int>(::CUDA_C_64F) == c::CUDA_C_64F);
static_assert(static_cast<int>(::cudaMemcpyHostToDevice) == c::cudaMemcpyHostToDevice);
static_assert(static_cast<int>(::cudaMemcpyDeviceToHost) == c::cudaMemcpyDeviceToHost);
static_assert(static_cast<int>(::cudaMemcpyDefault) == c::cudaMemcpyDefault);
static_assert(static_cast<int>(::cudaSuccess) == c::cudaSuccess);
static_assert(static_cast<int>(::cudaErrorPeerAccessAlreadyEnabled) ==
              c::cudaErrorPeerAccessAlreadyEnabled);
static_assert(std::is_same_v<::cudaStream_t, cudaStream_t>);
static_assert(sizeof(::cudaDataType) == sizeof(c::cudaDataType));
static_assert(sizeof(::cudaError_t) == sizeof(c::cudaError_t));
JAXMG_SAME_SHAPE(cudaGetDevice);
JAXMG_SAME_SHAPE(cudaSetDevice);
JAXMG_SAME_SHAPE(cudaStreamSynchronize);
JAXMG_SAME_SHAPE(cudaStreamCreate);
JAXMG_SAME_SHAPE(cudaStreamDestroy);
JAXMG_SAME_SHAPE(cudaMemcpy);
JAXMG_SAME_SHAPE(cudaMemcpyAsync);
JAXMG_SAME_SHAPE(cudaMemsetAsync);
JAXMG_SAME_SHAPE(cudaDeviceCanAccessPeer);
JAXMG_SAME_SHAPE(cudaDeviceEnablePeerAccess);
JAXMG_SAME_SHAPE(cudaGetErrorString);
JAXMG_SAME_SHAPE(cudaGetLastError);
JAXMG_SAME_SHAPE(cudaDeviceSynchronize);
JAXMG_SAME_SHAPE(cudaMalloc);
JAXMG_SAME_SHAPE(cudaFree);
JAXMG_SAME_SHAPE(cudaDeviceGetPCIBusId);
JAXMG_SAME_SHAPE(cudaDeviceGetByPCIBusId);
JAXMG_SAME_SHAPE(cudaIpcGetMemHandle);
JAXMG_SAME_SHAPE(cudaIpcOpenMemHandle);
JAXMG_SAME_SHAPE(cudaIpcCloseMemHandle);
static_assert(sizeof(::cudaIpcMemHandle_t) == sizeof(c::cudaIpcMemHandle_t));
static_assert(CUDA_IPC_HANDLE_SIZE == c::kIpcHandleSize);
static_assert(cudaIpcMemLazyEnablePeerAccess == c::kIpcMemLazyEnablePeerAccess);
#endif

#if __has_include(<cuda.h>)
#include <cuda.h>

static_assert(static_cast<int>(::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) ==
              c::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
static_assert(static_cast<int>(::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) ==
              c::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE);
static_assert(static_cast<int>(::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) ==
              c::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
static_assert(static_cast<int>(::CU_POINTER_ATTRIBUTE_RANGE_SIZE) ==
              c::CU_POINTER_ATTRIBUTE_RANGE_SIZE);
static_assert(std::is_same_v<::CUdeviceptr, c::CUdeviceptr>);
JAXMG_SAME_SHAPE(cuPointerGetAttribute);
#endif

#if __has_include(<cusolverMg.h>)
#include <cusolverMg.h>

static_assert(static_cast<int>(::CUBLAS_FILL_MODE_LOWER) == c::CUBLAS_FILL_MODE_LOWER);
static_assert(static_cast<int>(::CUBLAS_FILL_MODE_UPPER) == c::CUBLAS_FILL_MODE_UPPER);
static_assert(static_cast<int>(::CUSOLVER_EIG_MODE_VECTOR) == c::CUSOLVER_EIG_MODE_VECTOR);
static_assert(static_cast<int>(::CUSOLVER_EIG_MODE_NOVECTOR) == c::CUSOLVER_EIG_MODE_NOVECTOR);
static_assert(static_cast<int>(::CUDALIBMG_GRID_MAPPING_COL_MAJOR) ==
              c::CUDALIBMG_GRID_MAPPING_COL_MAJOR);
static_assert(static_cast<int>(::CUSOLVER_STATUS_SUCCESS) == c::CUSOLVER_STATUS_SUCCESS);
static_assert(sizeof(::cusolverMgHandle_t) == sizeof(c::cusolverMgHandle_t));
static_assert(sizeof(::cudaLibMgGrid_t) == sizeof(c::cudaLibMgGrid_t));
static_assert(sizeof(::cudaLibMgMatrixDesc_t) == sizeof(c::cudaLibMgMatrixDesc_t));
static_assert(sizeof(::cublasFillMode_t) == sizeof(c::cublasFillMode_t));
static_assert(sizeof(::cusolverEigMode_t) == sizeof(c::cusolverEigMode_t));
JAXMG_SAME_SHAPE(cusolverMgCreate);
JAXMG_SAME_SHAPE(cusolverMgDestroy);
JAXMG_SAME_SHAPE(cusolverMgDeviceSelect);
JAXMG_SAME_SHAPE(cusolverMgCreateDeviceGrid);
JAXMG_SAME_SHAPE(cusolverMgDestroyGrid);
JAXMG_SAME_SHAPE(cusolverMgCreateMatrixDesc);
JAXMG_SAME_SHAPE(cusolverMgDestroyMatrixDesc);
JAXMG_SAME_SHAPE(cusolverMgPotrf_bufferSize);
JAXMG_SAME_SHAPE(cusolverMgPotrf);
JAXMG_SAME_SHAPE(cusolverMgPotrs_bufferSize);
JAXMG_SAME_SHAPE(cusolverMgPotrs);
JAXMG_SAME_SHAPE(cusolverMgPotri_bufferSize);
JAXMG_SAME_SHAPE(cusolverMgPotri);
JAXMG_SAME_SHAPE(cusolverMgSyevd_bufferSize);
JAXMG_SAME_SHAPE(cusolverMgSyevd);
#endif
