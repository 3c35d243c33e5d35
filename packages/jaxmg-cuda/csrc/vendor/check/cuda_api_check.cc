// Checks csrc/vendor/cuda_api.h against NVIDIA's own headers, at compile time only (nothing here
// is linked into the module). Compiled by `nox -s cuda_abi` once per CUDA major version (12 and
// 13, headers from NVIDIA's wheels) and by CMake when it finds the headers of one CUDA version
// that compile on their own.
//
// What it proves, for the headers it is compiled against:
//  1. Every function of the three X-macro lists has exactly NVIDIA's prototype. Two ways:
//     a. the list entry, read with NVIDIA's types (the names in the lists resolve to the global
//        ones of the real headers here), is the type of &::name;
//     b. the member of jaxmg::cuda::Api that the loader fills is the type of &::name with each
//        NVIDIA type replaced by our mirror of it (OursOf, abi_check.h, through pointers,
//        const, arrays and function types), and the function returns its library's status
//        type.
//     A changed qualifier, pointer level or parameter type fails; so does a header that renames
//     the function with a macro (the loader would dlsym the old name).
//  2. Every mirrored type has NVIDIA's size, alignment and kind (enum, struct, pointer).
//  3. Every enumerator and constant of vendor/cuda_api.h has NVIDIA's value.
// What it cannot prove: that the libraries export the names (the nox session reads their
// symbol tables) or that calls behave as documented (only a GPU run shows that).
#include "vendor/cuda_api.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cusolverMg.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "vendor/check/abi_check.h"

#if CUDART_VERSION < 12000
#error "cuda_api_check.cc: the CUDA headers found are older than CUDA 12"
#endif
#if CUDART_VERSION / 1000 != CUDA_VERSION / 1000 || CUBLAS_VER_MAJOR != CUDART_VERSION / 1000 || \
    CUSOLVER_VER_MAJOR + 1 != CUDART_VERSION / 1000
#error "cuda_api_check.cc: the CUDA headers found are of different CUDA versions"
#endif

namespace c = jaxmg::cuda;

// Every NVIDIA type that vendor/cuda_api.h mirrors: M(ours, NVIDIA's). Each pair gets an OursOf
// specialization and the layout checks of JAXMG_ABI_CHECK_MIRROR.
#define JAXMG_MIRRORED_TYPES(M)                                          \
  M(c::cudaError_t, ::cudaError_t)                                       \
  M(c::cusolverStatus_t, ::cusolverStatus_t)                             \
  M(c::CUresult, ::CUresult)                                             \
  M(c::cudaDataType, ::cudaDataType)                                     \
  M(c::cublasFillMode_t, ::cublasFillMode_t)                             \
  M(c::cublasOperation_t, ::cublasOperation_t)                           \
  M(c::cusolverEigMode_t, ::cusolverEigMode_t)                           \
  M(c::cusolverMgGridMapping_t, ::cusolverMgGridMapping_t)               \
  M(c::cudaMemcpyKind, ::cudaMemcpyKind)                                 \
  M(c::CUpointer_attribute, ::CUpointer_attribute)                       \
  M(c::cudaIpcMemHandle_t, ::cudaIpcMemHandle_t)                         \
  M(std::remove_pointer_t<c::cusolverMgHandle_t>,                        \
    std::remove_pointer_t<::cusolverMgHandle_t>)

namespace jaxmg_abi {
JAXMG_MIRRORED_TYPES(JAXMG_ABI_OURS_OF)

}  // namespace jaxmg_abi

// --- 2. Layout of each mirrored type. ----------------------------------------------------------

#define JAXMG_CHECK_MIRROR(ours, theirs) JAXMG_ABI_CHECK_MIRROR("cuda_api.h", ours, theirs)
JAXMG_MIRRORED_TYPES(JAXMG_CHECK_MIRROR)
#undef JAXMG_CHECK_MIRROR

// Types we take over as they are, not mirrored.
static_assert(std::is_same_v<::cudaStream_t, cudaStream_t>);
static_assert(std::is_same_v<c::cudaLibMgGrid_t, ::cudaLibMgGrid_t>);
static_assert(std::is_same_v<c::cudaLibMgMatrixDesc_t, ::cudaLibMgMatrixDesc_t>);
static_assert(std::is_same_v<c::CUdeviceptr, ::CUdeviceptr>);
static_assert(std::is_same_v<jaxmg_abi::Ours<::cusolverMgHandle_t>, c::cusolverMgHandle_t>);

// --- 1. Prototypes. --------------------------------------------------------------------------

// At global scope, so that the type names in the lists are NVIDIA's.
// (#name here, before `name` is macro-expanded on its way into JAXMG_ABI_CHECK_FUNCTION, is
// the spelling the loader passes to dlsym.)
#define JAXMG_CHECK_FUNCTION(status, ret, name, params, spelled) \
  JAXMG_ABI_CHECK_FUNCTION("cuda_api.h", jaxmg::cuda::Api, status, ret, name, params, spelled)
#define JAXMG_CHECK_CUDART(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::cudaError_t, ret, name, params, #name)
#define JAXMG_CHECK_DRIVER(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::CUresult, ret, name, params, #name)
#define JAXMG_CHECK_CUSOLVERMG(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::cusolverStatus_t, ret, name, params, #name)
JAXMG_CUDART_FUNCTIONS(JAXMG_CHECK_CUDART)
JAXMG_DRIVER_FUNCTIONS(JAXMG_CHECK_DRIVER)
JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_CHECK_CUSOLVERMG)

// --- 3. Values. ------------------------------------------------------------------------------

#define JAXMG_SAME_VALUE(name) JAXMG_ABI_SAME_VALUE("cuda_api.h", c, name)

JAXMG_SAME_VALUE(CUDA_R_32F);
JAXMG_SAME_VALUE(CUDA_R_64F);
JAXMG_SAME_VALUE(CUDA_C_32F);
JAXMG_SAME_VALUE(CUDA_C_64F);
JAXMG_SAME_VALUE(CUBLAS_FILL_MODE_LOWER);
JAXMG_SAME_VALUE(CUBLAS_FILL_MODE_UPPER);
JAXMG_SAME_VALUE(CUBLAS_OP_N);
JAXMG_SAME_VALUE(CUBLAS_OP_T);
JAXMG_SAME_VALUE(CUBLAS_OP_C);
JAXMG_SAME_VALUE(CUSOLVER_EIG_MODE_NOVECTOR);
JAXMG_SAME_VALUE(CUSOLVER_EIG_MODE_VECTOR);
JAXMG_SAME_VALUE(CUDALIBMG_GRID_MAPPING_ROW_MAJOR);
JAXMG_SAME_VALUE(CUDALIBMG_GRID_MAPPING_COL_MAJOR);
JAXMG_SAME_VALUE(cudaMemcpyHostToDevice);
JAXMG_SAME_VALUE(cudaMemcpyDeviceToHost);
JAXMG_SAME_VALUE(cudaMemcpyDefault);
JAXMG_SAME_VALUE(cudaSuccess);
JAXMG_SAME_VALUE(cudaErrorPeerAccessAlreadyEnabled);
JAXMG_SAME_VALUE(CUSOLVER_STATUS_SUCCESS);
JAXMG_SAME_VALUE(CUSOLVER_STATUS_INTERNAL_ERROR);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_SIZE);
static_assert(c::kIpcHandleSize == CUDA_IPC_HANDLE_SIZE,
              "kIpcHandleSize: cuda_api.h's value is not NVIDIA's CUDA_IPC_HANDLE_SIZE");
static_assert(sizeof(c::cudaIpcMemHandle_t::reserved) == sizeof(::cudaIpcMemHandle_t::reserved));
static_assert(c::kIpcMemLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess,
              "kIpcMemLazyEnablePeerAccess: cuda_api.h's value is not NVIDIA's "
              "cudaIpcMemLazyEnablePeerAccess");

// Error codes that vendor/cuda_api.h may or may not declare: checked when it does. Qualified lookup
// of c::name finds the fallback below only when jaxmg::cuda itself declares no such name.
namespace jaxmg::cuda {
namespace abi_check_fallback {
struct NotDeclared {};
inline constexpr NotDeclared cudaErrorPeerAccessUnsupported{};
inline constexpr NotDeclared cudaErrorPeerAccessNotEnabled{};
inline constexpr NotDeclared cudaErrorTooManyPeers{};
}  // namespace abi_check_fallback
using namespace abi_check_fallback;  // NOLINT(build/namespaces): see above
}  // namespace jaxmg::cuda

#define JAXMG_SAME_VALUE_IF_DECLARED(name)                                      \
  static_assert(                                                                \
      [](auto ours) {                                                           \
        if constexpr (std::is_same_v<decltype(ours),                            \
                                     c::abi_check_fallback::NotDeclared>) {     \
          return true;                                                          \
        } else {                                                                \
          return static_cast<long long>(ours) == static_cast<long long>(::name); \
        }                                                                       \
      }(c::name),                                                               \
      #name ": cuda_api.h's value is not NVIDIA's")

JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorPeerAccessUnsupported);
JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorPeerAccessNotEnabled);
JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorTooManyPeers);

// The names vendor/cuda_api.cc's CusolverStatusName gives to the codes 1..9.
static_assert(::CUSOLVER_STATUS_NOT_INITIALIZED == 1);
static_assert(::CUSOLVER_STATUS_ALLOC_FAILED == 2);
static_assert(::CUSOLVER_STATUS_INVALID_VALUE == 3);
static_assert(::CUSOLVER_STATUS_ARCH_MISMATCH == 4);
static_assert(::CUSOLVER_STATUS_MAPPING_ERROR == 5);
static_assert(::CUSOLVER_STATUS_EXECUTION_FAILED == 6);
static_assert(::CUSOLVER_STATUS_INTERNAL_ERROR == 7);
static_assert(::CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED == 8);
static_assert(::CUSOLVER_STATUS_NOT_SUPPORTED == 9);
