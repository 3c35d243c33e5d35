// Checks csrc/vendor/cusolvermp_api.h against NVIDIA's cusolverMp.h and nccl.h, at compile time
// only (nothing here is linked into the module). Compiled by `nox -s cuda_abi` once per CUDA major
// version, against the headers of the cuSOLVERMp and NCCL wheels for it plus those of that
// CUDA version's runtime, cuSOLVER and cuBLAS wheels (cusolverMp.h includes cusolverDn.h).
//
// What it proves, for the headers it is compiled against (the machinery is abi_check.h's, the
// same as cuda_api_check.cc's):
//  1. Every function of JAXMG_NCCL_FUNCTIONS and JAXMG_CUSOLVERMP_FUNCTIONS has exactly
//     NVIDIA's prototype: the list entry read with NVIDIA's types is the type of &::name, and
//     jaxmg::cuda::MpApi's member is that type with our mirrored types; no header renames the
//     function with a macro; a function returning one of our `int` status types returns
//     NVIDIA's status enum (cusolverStatus_t, ncclResult_t).
//  2. Every mirrored type has NVIDIA's size, alignment and kind (enum, struct, pointer).
//  3. Every enumerator and constant of vendor/cusolvermp_api.h has NVIDIA's value.
// What it cannot prove: that libcusolverMp.so.0 and libnccl.so.2 export the names (the nox
// session reads their symbol tables) or that calls behave as documented (a GPU run).
#include <cusolverMp.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "vendor/check/abi_check.h"
#include "vendor/cusolvermp_api.h"

static_assert(CUSOLVERMP_VERSION >= jaxmg::cuda::kCusolverMpOldest,
              "kCusolverMpOldest: cusolverMp.h is older than the oldest cuSOLVERMp jaxmg binds");
// The GESVD list exists from kCusolverMpGesvdSince (0.9.0) on; `nox -s cuda_abi` also checks
// that the 0.8.0 library lacks those names and the 0.9.1 library exports them.
#define JAXMG_HAS_GESVD (CUSOLVERMP_VERSION >= 900)
#if JAXMG_HAS_GESVD
static_assert(jaxmg::cuda::kCusolverMpGesvdSince <= CUSOLVERMP_VERSION,
              "kCusolverMpGesvdSince: this cusolverMp.h declares cusolverMpGesvd");
#else
static_assert(jaxmg::cuda::kCusolverMpGesvdSince > CUSOLVERMP_VERSION,
              "kCusolverMpGesvdSince: this cusolverMp.h lacks cusolverMpGesvd");
#endif
#if NCCL_MAJOR != 2
#error "cusolvermp_api_check.cc: nccl.h is not NCCL 2"
#endif

namespace c = jaxmg::cuda;

// Every NVIDIA type that the lists of vendor/cusolvermp_api.h use and that we mirror,
// vendor/cuda_api.h's included: M(ours, NVIDIA's).
#define JAXMG_MIRRORED_TYPES(M)                                                                \
  M(c::cusolverStatus_t, ::cusolverStatus_t)                                                   \
  M(c::ncclResult_t, ::ncclResult_t)                                                           \
  M(c::cudaDataType, ::cudaDataType)                                                           \
  M(c::cublasFillMode_t, ::cublasFillMode_t)                                                   \
  M(c::cublasOperation_t, ::cublasOperation_t)                                                 \
  M(c::cusolverEigMode_t, ::cusolverEigMode_t)                                                 \
  M(c::cusolverMpGridMapping_t, ::cusolverMpGridMapping_t)                                     \
  M(c::ncclDataType_t, ::ncclDataType_t)                                                       \
  M(c::ncclRedOp_t, ::ncclRedOp_t)                                                             \
  M(c::ncclUniqueId, ::ncclUniqueId)                                                           \
  M(std::remove_pointer_t<c::ncclComm_t>, std::remove_pointer_t<::ncclComm_t>)                 \
  M(std::remove_pointer_t<c::cusolverMpHandle_t>, std::remove_pointer_t<::cusolverMpHandle_t>) \
  M(std::remove_pointer_t<c::cusolverMpGrid_t>, std::remove_pointer_t<::cusolverMpGrid_t>)     \
  M(std::remove_pointer_t<c::cusolverMpMatrixDescriptor_t>,                                    \
    std::remove_pointer_t<::cusolverMpMatrixDescriptor_t>)

namespace jaxmg_abi {
JAXMG_MIRRORED_TYPES(JAXMG_ABI_OURS_OF)
}  // namespace jaxmg_abi

// --- 2. Layout of each mirrored type. ----------------------------------------------------------

#define JAXMG_CHECK_MIRROR(ours, theirs) JAXMG_ABI_CHECK_MIRROR("cusolvermp_api.h", ours, theirs)
JAXMG_MIRRORED_TYPES(JAXMG_CHECK_MIRROR)
#undef JAXMG_CHECK_MIRROR

// The handles, through OursOf.
static_assert(std::is_same_v<jaxmg_abi::Ours<::ncclComm_t>, c::ncclComm_t>);
static_assert(std::is_same_v<jaxmg_abi::Ours<::cusolverMpHandle_t>, c::cusolverMpHandle_t>);
static_assert(std::is_same_v<jaxmg_abi::Ours<::cusolverMpGrid_t>, c::cusolverMpGrid_t>);
static_assert(std::is_same_v<jaxmg_abi::Ours<::cusolverMpMatrixDescriptor_t>,
                             c::cusolverMpMatrixDescriptor_t>);
#if JAXMG_HAS_GESVD
namespace jaxmg_abi {
JAXMG_ABI_OURS_OF(std::remove_pointer_t<c::cusolverMpGesvdDescriptor_t>,
                  std::remove_pointer_t<::cusolverMpGesvdDescriptor_t>)
}  // namespace jaxmg_abi
JAXMG_ABI_CHECK_MIRROR("cusolvermp_api.h", std::remove_pointer_t<c::cusolverMpGesvdDescriptor_t>,
                       std::remove_pointer_t<::cusolverMpGesvdDescriptor_t>)
static_assert(
    std::is_same_v<jaxmg_abi::Ours<::cusolverMpGesvdDescriptor_t>, c::cusolverMpGesvdDescriptor_t>);
#endif
// Taken over as it is (vendor/cuda_api.h's global typedef).
static_assert(std::is_same_v<::cudaStream_t, cudaStream_t>);

// --- 1. Prototypes. --------------------------------------------------------------------------

// At global scope, so that the type names in the lists are NVIDIA's. (#name here, before
// `name` is macro-expanded, is the spelling a loader passes to dlsym.)
#define JAXMG_CHECK_FUNCTION(status, ret, name, params, spelled)                              \
  JAXMG_ABI_CHECK_FUNCTION("cusolvermp_api.h", jaxmg::cuda::MpApi, status, ret, name, params, \
                           spelled)
#define JAXMG_CHECK_NCCL(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::ncclResult_t, ret, name, params, #name)
#define JAXMG_CHECK_CUSOLVERMP(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::cusolverStatus_t, ret, name, params, #name)
JAXMG_NCCL_FUNCTIONS(JAXMG_CHECK_NCCL)
JAXMG_CUSOLVERMP_FUNCTIONS(JAXMG_CHECK_CUSOLVERMP)
#if JAXMG_HAS_GESVD
JAXMG_CUSOLVERMP_GESVD_FUNCTIONS(JAXMG_CHECK_CUSOLVERMP)
#endif

// --- 3. Values. ------------------------------------------------------------------------------

#define JAXMG_SAME_VALUE(name) JAXMG_ABI_SAME_VALUE("cusolvermp_api.h", c, name)

JAXMG_SAME_VALUE(ncclSuccess);
JAXMG_SAME_VALUE(ncclFloat32);
JAXMG_SAME_VALUE(ncclFloat64);
JAXMG_SAME_VALUE(ncclSum);
JAXMG_SAME_VALUE(CUSOLVERMP_GRID_MAPPING_ROW_MAJOR);
JAXMG_SAME_VALUE(CUSOLVERMP_GRID_MAPPING_COL_MAJOR);
static_assert(c::kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES,
              "kNcclUniqueIdBytes: cusolvermp_api.h's value is not NVIDIA's NCCL_UNIQUE_ID_BYTES");
static_assert(sizeof(c::ncclUniqueId::internal) == sizeof(::ncclUniqueId::internal),
              "ncclUniqueId: cusolvermp_api.h's bytes are not NVIDIA's");
