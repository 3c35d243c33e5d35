// The subset of the CUDA runtime and cuSolverMg API jaxmg uses, declared here so the package
// builds with no CUDA toolkit; the libraries are opened with dlopen at first GPU use.
// Values and signatures follow cuda_runtime_api.h, library_types.h, cublas_api.h,
// cusolver_common.h and cusolverMg.h; csrc/vendor/check/cuda_api_check.cc asserts the enum
// values against the real headers whenever CMake finds them.
#ifndef JAXMG_CUDA_API_H_
#define JAXMG_CUDA_API_H_

#include <cstdint>
#include <string>
#include <vector>

typedef struct CUstream_st* cudaStream_t;  // same spelling as the runtime's, for the FFI

namespace jaxmg::cuda {

using cudaError_t = int;
using cusolverStatus_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorPeerAccessAlreadyEnabled = 704;
constexpr cusolverStatus_t CUSOLVER_STATUS_SUCCESS = 0;
constexpr cusolverStatus_t CUSOLVER_STATUS_INTERNAL_ERROR = 7;

typedef struct cusolverMgContext* cusolverMgHandle_t;
typedef void* cudaLibMgGrid_t;
typedef void* cudaLibMgMatrixDesc_t;

enum cusolverMgGridMapping_t { CUDALIBMG_GRID_MAPPING_ROW_MAJOR = 1, CUDALIBMG_GRID_MAPPING_COL_MAJOR = 0 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_C_32F = 4, CUDA_C_64F = 5 };
enum cublasFillMode_t { CUBLAS_FILL_MODE_LOWER = 0, CUBLAS_FILL_MODE_UPPER = 1 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cusolverEigMode_t { CUSOLVER_EIG_MODE_NOVECTOR = 0, CUSOLVER_EIG_MODE_VECTOR = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDefault = 4 };

// CUDA IPC (the multi-process mode): a handle is 64 opaque bytes, passed by value.
constexpr int kIpcHandleSize = 64;
struct cudaIpcMemHandle_t {
  char reserved[kIpcHandleSize];
};
constexpr unsigned int kIpcMemLazyEnablePeerAccess = 0x01;  // cudaIpcMemLazyEnablePeerAccess

// The driver API's pointer attributes (cuda.h), for the allocation that holds a pointer.
using CUresult = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's spelling
enum CUpointer_attribute {
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};

// Every function jaxmg calls, one list per library: X(return type, name, (parameters)). The
// lists are the single source of the Api table below, of the loader's dlsym calls
// (cuda_api.cc) and of the check against NVIDIA's own headers and libraries
// (vendor/check/cuda_api_check.cc, `nox -s cuda_abi`).
#define JAXMG_CUDART_FUNCTIONS(X)                                                             \
  X(cudaError_t, cudaGetDevice, (int*))                                                       \
  X(cudaError_t, cudaSetDevice, (int))                                                        \
  X(cudaError_t, cudaStreamSynchronize, (cudaStream_t))                                       \
  X(cudaError_t, cudaStreamCreate, (cudaStream_t*))                                           \
  X(cudaError_t, cudaStreamDestroy, (cudaStream_t))                                           \
  X(cudaError_t, cudaMemcpy, (void*, const void*, size_t, cudaMemcpyKind))                    \
  X(cudaError_t, cudaMemcpyAsync, (void*, const void*, size_t, cudaMemcpyKind, cudaStream_t)) \
  X(cudaError_t, cudaMemsetAsync, (void*, int, size_t, cudaStream_t))                         \
  X(cudaError_t, cudaDeviceCanAccessPeer, (int*, int, int))                                   \
  X(cudaError_t, cudaDeviceEnablePeerAccess, (int, unsigned int))                             \
  X(const char*, cudaGetErrorString, (cudaError_t))                                           \
  X(cudaError_t, cudaGetLastError, ())                                                        \
  X(cudaError_t, cudaDeviceSynchronize, ())                                                   \
  X(cudaError_t, cudaMalloc, (void**, size_t))                                                \
  X(cudaError_t, cudaFree, (void*))                                                           \
  X(cudaError_t, cudaDeviceGetPCIBusId, (char*, int, int))                                    \
  X(cudaError_t, cudaDeviceGetByPCIBusId, (int*, const char*))                                \
  X(cudaError_t, cudaIpcGetMemHandle, (cudaIpcMemHandle_t*, void*))                           \
  X(cudaError_t, cudaIpcOpenMemHandle, (void**, cudaIpcMemHandle_t, unsigned int))            \
  X(cudaError_t, cudaIpcCloseMemHandle, (void*))

// The driver (libcuda.so.1, loaded by the runtime): optional, only the multi-process mode
// needs it, and says so when it is missing.
#define JAXMG_DRIVER_FUNCTIONS(X) \
  X(CUresult, cuPointerGetAttribute, (void*, CUpointer_attribute, CUdeviceptr))

#define JAXMG_CUSOLVERMG_FUNCTIONS(X)                                                          \
  X(cusolverStatus_t, cusolverMgCreate, (cusolverMgHandle_t*))                                 \
  X(cusolverStatus_t, cusolverMgDestroy, (cusolverMgHandle_t))                                 \
  X(cusolverStatus_t, cusolverMgDeviceSelect, (cusolverMgHandle_t, int, int[]))                \
  X(cusolverStatus_t, cusolverMgCreateDeviceGrid,                                              \
    (cudaLibMgGrid_t*, int32_t, int32_t, const int32_t[], cusolverMgGridMapping_t))            \
  X(cusolverStatus_t, cusolverMgDestroyGrid, (cudaLibMgGrid_t))                                \
  X(cusolverStatus_t, cusolverMgCreateMatrixDesc,                                              \
    (cudaLibMgMatrixDesc_t*, int64_t, int64_t, int64_t, int64_t, cudaDataType,                 \
     const cudaLibMgGrid_t))                                                                   \
  X(cusolverStatus_t, cusolverMgDestroyMatrixDesc, (cudaLibMgMatrixDesc_t))                    \
  X(cusolverStatus_t, cusolverMgPotrf_bufferSize,                                              \
    (cusolverMgHandle_t, cublasFillMode_t, int, void*[], int, int, cudaLibMgMatrixDesc_t,      \
     cudaDataType, int64_t*))                                                                  \
  X(cusolverStatus_t, cusolverMgPotrf,                                                         \
    (cusolverMgHandle_t, cublasFillMode_t, int, void*[], int, int, cudaLibMgMatrixDesc_t,      \
     cudaDataType, void*[], int64_t, int*))                                                    \
  X(cusolverStatus_t, cusolverMgPotrs_bufferSize,                                              \
    (cusolverMgHandle_t, cublasFillMode_t, int, int, void*[], int, int, cudaLibMgMatrixDesc_t, \
     void*[], int, int, cudaLibMgMatrixDesc_t, cudaDataType, int64_t*))                        \
  X(cusolverStatus_t, cusolverMgPotrs,                                                         \
    (cusolverMgHandle_t, cublasFillMode_t, int, int, void*[], int, int, cudaLibMgMatrixDesc_t, \
     void*[], int, int, cudaLibMgMatrixDesc_t, cudaDataType, void*[], int64_t, int*))          \
  X(cusolverStatus_t, cusolverMgPotri_bufferSize,                                              \
    (cusolverMgHandle_t, cublasFillMode_t, int, void*[], int, int, cudaLibMgMatrixDesc_t,      \
     cudaDataType, int64_t*))                                                                  \
  X(cusolverStatus_t, cusolverMgPotri,                                                         \
    (cusolverMgHandle_t, cublasFillMode_t, int, void*[], int, int, cudaLibMgMatrixDesc_t,      \
     cudaDataType, void*[], int64_t, int*))                                                    \
  X(cusolverStatus_t, cusolverMgGetrf_bufferSize,                                              \
    (cusolverMgHandle_t, int, int, void*[], int, int, cudaLibMgMatrixDesc_t, int*[],           \
     cudaDataType, int64_t*))                                                                  \
  X(cusolverStatus_t, cusolverMgGetrf,                                                         \
    (cusolverMgHandle_t, int, int, void*[], int, int, cudaLibMgMatrixDesc_t, int*[],           \
     cudaDataType, void*[], int64_t, int*))                                                    \
  X(cusolverStatus_t, cusolverMgGetrs_bufferSize,                                              \
    (cusolverMgHandle_t, cublasOperation_t, int, int, void*[], int, int,                       \
     cudaLibMgMatrixDesc_t, int*[], void*[], int, int, cudaLibMgMatrixDesc_t, cudaDataType,    \
     int64_t*))                                                                                \
  X(cusolverStatus_t, cusolverMgGetrs,                                                         \
    (cusolverMgHandle_t, cublasOperation_t, int, int, void*[], int, int,                       \
     cudaLibMgMatrixDesc_t, int*[], void*[], int, int, cudaLibMgMatrixDesc_t, cudaDataType,    \
     void*[], int64_t, int*))                                                                  \
  X(cusolverStatus_t, cusolverMgSyevd_bufferSize,                                              \
    (cusolverMgHandle_t, cusolverEigMode_t, cublasFillMode_t, int, void*[], int, int,          \
     cudaLibMgMatrixDesc_t, void*, cudaDataType, cudaDataType, int64_t*))                      \
  X(cusolverStatus_t, cusolverMgSyevd,                                                         \
    (cusolverMgHandle_t, cusolverEigMode_t, cublasFillMode_t, int, void*[], int, int,          \
     cudaLibMgMatrixDesc_t, void*, cudaDataType, cudaDataType, void*[], int64_t, int*))

// The function table filled by dlsym. The driver's members are nullptr when it is not found.
struct Api {
#define JAXMG_API_MEMBER(ret, name, params) ret(*name) params = nullptr;
  JAXMG_CUDART_FUNCTIONS(JAXMG_API_MEMBER)
  JAXMG_DRIVER_FUNCTIONS(JAXMG_API_MEMBER)
  JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_API_MEMBER)
#undef JAXMG_API_MEMBER
};

// Set where to look (NVIDIA wheel lib folders first); then the system loader's own search.
void SetLibraryDirs(const std::vector<std::string>& dirs);
// The loaded API, or nullptr with `error` saying what was tried.
const Api* Load(std::string* error);

}  // namespace jaxmg::cuda

#endif  // JAXMG_CUDA_API_H_
