// The subset of NVIDIA's cuSOLVERMp and NCCL APIs that jaxmg's multi-node GPU backend uses,
// declared here, like cuda_api.h, so the package builds with neither installed; the libraries
// are to be opened with dlopen at first use. Values and signatures follow cusolverMp.h
// (cuSOLVERMp 0.8.0 to 0.9.1, the same header in the CUDA 12 and CUDA 13 wheels of each) and
// nccl.h (NCCL 2.x);
// csrc/vendor/check/cusolvermp_api_check.cc asserts them against NVIDIA's headers and
// `nox -s cuda_abi` checks that the libraries export every name.
//
// The types cuSOLVERMp shares with cuSolverMg (cudaStream_t, cudaDataType, cublasFillMode_t,
// cublasOperation_t, cusolverStatus_t) are cuda_api.h's.
//
// Worth knowing before calling them (cuSOLVERMp 0.8 and 0.9):
//  - The grid is built on an NCCL communicator (ncclComm_t), since cuSOLVERMp 0.7; older
//    releases took libcal's cal_comm_t. One handle per process and GPU.
//  - Sizes, offsets and pivots are int64_t (ipiv too, unlike cuSolverMg's int); the global
//    offsets IA, JA, ... are 1-based, as in ScaLAPACK; RSRC/CSRC and NUMROC's process
//    coordinates are uint32_t; info stays an int*.
//  - Every routine takes a device and a host workspace, sized in bytes by its _bufferSize.
//  - Syevd's jobz is a `char*` ('V' or 'N'), not a cusolverEigMode_t, and not const: a string
//    literal needs a writable copy.
#ifndef JAXMG_CUSOLVERMP_API_H_
#define JAXMG_CUSOLVERMP_API_H_

#include <cstddef>
#include <cstdint>

#include "vendor/cuda_api.h"

namespace jaxmg::cuda {

// The sonames to dlopen: nvidia-cusolvermp-cu12 and -cu13 put theirs in nvidia/cu12/lib and
// nvidia/cu13/lib; nvidia-nccl-cu12 and -cu13 both in nvidia/nccl/lib.
inline constexpr char kCusolverMpLibrary[] = "libcusolverMp.so.0";
inline constexpr char kNcclLibrary[] = "libnccl.so.2";

// --- NCCL (nccl.h) ----------------------------------------------------------------------------

using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0;

typedef struct ncclComm* ncclComm_t;

// The element types and the reduction of ncclAllReduce that jaxmg uses (complex values travel
// as pairs of reals).
enum ncclDataType_t { ncclFloat32 = 7, ncclFloat64 = 8 };
enum ncclRedOp_t { ncclSum = 0 };

// The rendezvous token: rank 0 makes it, every rank passes the same bytes, by value.
constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct ncclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

// --- cuSOLVERMp (cusolverMp.h) ----------------------------------------------------------------

typedef struct cusolverMpHandle* cusolverMpHandle_t;
typedef struct cusolverMpGrid* cusolverMpGrid_t;
typedef struct cusolverMpMatrixDescriptor* cusolverMpMatrixDescriptor_t;

typedef struct cusolverMpGesvdDescriptor* cusolverMpGesvdDescriptor_t;  // cuSOLVERMp >= 0.9.0

// The releases jaxmg binds, as cusolverMpGetVersion and CUSOLVERMP_VERSION write them (major *
// 1000 + minor * 100 + patch). 0.8.0 is the newest that runs on NCCL 2.28 (0.9.x needs
// cuBLASMp, and cuBLASMp >= 0.8 NCCL >= 2.29.2); 0.7.x lacks cusolverMpSetStream.
inline constexpr int kCusolverMpOldest = 800;
// cusolverMpGesvd and its descriptor (JAXMG_CUSOLVERMP_GESVD_FUNCTIONS) first came in 0.9.0.
inline constexpr int kCusolverMpGesvdSince = 900;

// How the ranks of the communicator fill the process grid.
enum cusolverMpGridMapping_t {
  CUSOLVERMP_GRID_MAPPING_ROW_MAJOR = 1,
  CUSOLVERMP_GRID_MAPPING_COL_MAJOR = 0,
};

// Every function, one list per library: X(return type, name, (parameters)), the same form as
// cuda_api.h's lists. They are the single source of the MpApi table below and of the check
// against NVIDIA's headers and libraries (vendor/check/cusolvermp_api_check.cc, `nox -s cuda_abi`).
#define JAXMG_NCCL_FUNCTIONS(X)                                                          \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId*))                                      \
  X(ncclResult_t, ncclCommInitRank, (ncclComm_t*, int, ncclUniqueId, int))               \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t))                                         \
  X(ncclResult_t, ncclAllReduce,                                                         \
    (const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)) \
  X(const char*, ncclGetErrorString, (ncclResult_t))

// Parameters, in order (A, B, Q: pointer to the local array, IA, JA: 1-based global offset,
// descA: descriptor):
//  Create (handle*, deviceId, stream)
//  CreateDeviceGrid (handle, grid*, comm, numRowDevices, numColDevices, mapping)
//  CreateMatrixDesc (desc*, grid, dataType, M, N, MB, NB, RSRC, CSRC, LLD)
//  NUMROC (n, nb, iproc, isrcproc, nprocs)
//  Potrf (handle, uplo, n, A, IA, JA, descA, computeType, d_work, d_bytes, h_work, h_bytes,
//         info)
//  Potrs (handle, uplo, n, nrhs, A, IA, JA, descA, B, IB, JB, descB, computeType, <work>, info)
//  Getrf (handle, m, n, A, IA, JA, descA, ipiv, computeType, <work>, info)
//  Getrs (handle, trans, n, nrhs, A, IA, JA, descA, ipiv, B, IB, JB, descB, computeType,
//         <work>, info)
//  Syevd (handle, jobz, uplo, n, A, IA, JA, descA, D (eigenvalues), Q, IQ, JQ, descQ,
//         computeType, <work>, info)
//  Geqrf (handle, m, n, A, IA, JA, descA, tau, computeType, <work>, info)
//  Orgqr (handle, m, n, k, A, IA, JA, descA, tau, computeType, <work>, info)
//  Gels (handle, trans, m, n, nrhs, A, IA, JA, descA, B, IB, JB, descB, computeType, <work>,
//        info)
//  Gesvd (handle, gesvdDesc, jobu, jobvt, m, n, A, IA, JA, descA, S, U, IU, JU, descU, VT, IVT,
//         JVT, descVT, computeType, <work>, info)
// Each _bufferSize takes the same parameters up to computeType, then (d_bytes*, h_bytes*).
#define JAXMG_CUSOLVERMP_FUNCTIONS(X)                                                             \
  X(cusolverStatus_t, cusolverMpCreate, (cusolverMpHandle_t*, int, cudaStream_t))                 \
  X(cusolverStatus_t, cusolverMpGetVersion, (cusolverMpHandle_t, int*))                           \
  X(cusolverStatus_t, cusolverMpDestroy, (cusolverMpHandle_t))                                    \
  X(cusolverStatus_t, cusolverMpSetStream, (cusolverMpHandle_t, cudaStream_t))                    \
  X(cusolverStatus_t, cusolverMpCreateDeviceGrid,                                                 \
    (cusolverMpHandle_t, cusolverMpGrid_t*, ncclComm_t, int32_t, int32_t,                         \
     cusolverMpGridMapping_t))                                                                    \
  X(cusolverStatus_t, cusolverMpDestroyGrid, (cusolverMpGrid_t))                                  \
  X(cusolverStatus_t, cusolverMpCreateMatrixDesc,                                                 \
    (cusolverMpMatrixDescriptor_t*, cusolverMpGrid_t, cudaDataType, int64_t, int64_t, int64_t,    \
     int64_t, uint32_t, uint32_t, int64_t))                                                       \
  X(cusolverStatus_t, cusolverMpDestroyMatrixDesc, (cusolverMpMatrixDescriptor_t))                \
  X(int64_t, cusolverMpNUMROC, (int64_t, int64_t, uint32_t, uint32_t, uint32_t))                  \
  X(cusolverStatus_t, cusolverMpPotrf_bufferSize,                                                 \
    (cusolverMpHandle_t, cublasFillMode_t, int64_t, const void*, int64_t, int64_t,                \
     cusolverMpMatrixDescriptor_t, cudaDataType, size_t*, size_t*))                               \
  X(cusolverStatus_t, cusolverMpPotrf,                                                            \
    (cusolverMpHandle_t, cublasFillMode_t, int64_t, void*, int64_t, int64_t,                      \
     cusolverMpMatrixDescriptor_t, cudaDataType, void*, size_t, void*, size_t, int*))             \
  X(cusolverStatus_t, cusolverMpPotrs_bufferSize,                                                 \
    (cusolverMpHandle_t, cublasFillMode_t, int64_t, int64_t, const void*, int64_t, int64_t,       \
     cusolverMpMatrixDescriptor_t, const void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,   \
     cudaDataType, size_t*, size_t*))                                                             \
  X(cusolverStatus_t, cusolverMpPotrs,                                                            \
    (cusolverMpHandle_t, cublasFillMode_t, int64_t, int64_t, const void*, int64_t, int64_t,       \
     cusolverMpMatrixDescriptor_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,         \
     cudaDataType, void*, size_t, void*, size_t, int*))                                           \
  X(cusolverStatus_t, cusolverMpGetrf_bufferSize,                                                 \
    (cusolverMpHandle_t, int64_t, int64_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, \
     int64_t*, cudaDataType, size_t*, size_t*))                                                   \
  X(cusolverStatus_t, cusolverMpGetrf,                                                            \
    (cusolverMpHandle_t, int64_t, int64_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, \
     int64_t*, cudaDataType, void*, size_t, void*, size_t, int*))                                 \
  X(cusolverStatus_t, cusolverMpGetrs_bufferSize,                                                 \
    (cusolverMpHandle_t, cublasOperation_t, int64_t, int64_t, const void*, int64_t, int64_t,      \
     cusolverMpMatrixDescriptor_t, const int64_t*, void*, int64_t, int64_t,                       \
     cusolverMpMatrixDescriptor_t, cudaDataType, size_t*, size_t*))                               \
  X(cusolverStatus_t, cusolverMpGetrs,                                                            \
    (cusolverMpHandle_t, cublasOperation_t, int64_t, int64_t, const void*, int64_t, int64_t,      \
     cusolverMpMatrixDescriptor_t, const int64_t*, void*, int64_t, int64_t,                       \
     cusolverMpMatrixDescriptor_t, cudaDataType, void*, size_t, void*, size_t, int*))             \
  X(cusolverStatus_t, cusolverMpSyevd_bufferSize,                                                 \
    (cusolverMpHandle_t, char*, cublasFillMode_t, int64_t, void*, int64_t, int64_t,               \
     cusolverMpMatrixDescriptor_t, void*, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,  \
     cudaDataType, size_t*, size_t*))                                                             \
  X(cusolverStatus_t, cusolverMpSyevd,                                                            \
    (cusolverMpHandle_t, char*, cublasFillMode_t, int64_t, void*, int64_t, int64_t,               \
     cusolverMpMatrixDescriptor_t, void*, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,  \
     cudaDataType, void*, size_t, void*, size_t, int*))                                           \
  X(cusolverStatus_t, cusolverMpGeqrf_bufferSize,                                                 \
    (cusolverMpHandle_t, int64_t, int64_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, \
     cudaDataType, size_t*, size_t*))                                                             \
  X(cusolverStatus_t, cusolverMpGeqrf,                                                            \
    (cusolverMpHandle_t, int64_t, int64_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, \
     void*, cudaDataType, void*, size_t, void*, size_t, int*))                                    \
  X(cusolverStatus_t, cusolverMpOrgqr_bufferSize,                                                 \
    (cusolverMpHandle_t, int64_t, int64_t, int64_t, const void*, int64_t, int64_t,                \
     cusolverMpMatrixDescriptor_t, const void*, cudaDataType, size_t*, size_t*))                  \
  X(cusolverStatus_t, cusolverMpOrgqr,                                                            \
    (cusolverMpHandle_t, int64_t, int64_t, int64_t, void*, int64_t, int64_t,                      \
     cusolverMpMatrixDescriptor_t, const void*, cudaDataType, void*, size_t, void*, size_t,       \
     int*))                                                                                       \
  X(cusolverStatus_t, cusolverMpGels_bufferSize,                                                  \
    (cusolverMpHandle_t, cublasOperation_t, int64_t, int64_t, int64_t, void*, int64_t, int64_t,   \
     cusolverMpMatrixDescriptor_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,         \
     cudaDataType, size_t*, size_t*))                                                             \
  X(cusolverStatus_t, cusolverMpGels,                                                             \
    (cusolverMpHandle_t, cublasOperation_t, int64_t, int64_t, int64_t, void*, int64_t, int64_t,   \
     cusolverMpMatrixDescriptor_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t,         \
     cudaDataType, void*, size_t, void*, size_t, int*))

// cuSOLVERMp >= 0.9.0 only (kCusolverMpGesvdSince): bound where the library has them; a routine
// that needs them is refused, naming the versions, where it does not.
#define JAXMG_CUSOLVERMP_GESVD_FUNCTIONS(X)                                                      \
  X(cusolverStatus_t, cusolverMpGesvdDescriptorCreate, (cusolverMpGesvdDescriptor_t*))           \
  X(cusolverStatus_t, cusolverMpGesvdDescriptorDestroy, (cusolverMpGesvdDescriptor_t))           \
  X(cusolverStatus_t, cusolverMpGesvd_bufferSize,                                                \
    (cusolverMpHandle_t, cusolverMpGesvdDescriptor_t, cusolverEigMode_t, cusolverEigMode_t,      \
     int64_t, int64_t, const void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, const void*, \
     const void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, const void*, int64_t, int64_t, \
     cusolverMpMatrixDescriptor_t, cudaDataType, size_t*, size_t*))                              \
  X(cusolverStatus_t, cusolverMpGesvd,                                                           \
    (cusolverMpHandle_t, cusolverMpGesvdDescriptor_t, cusolverEigMode_t, cusolverEigMode_t,      \
     int64_t, int64_t, void*, int64_t, int64_t, cusolverMpMatrixDescriptor_t, void*, void*,      \
     int64_t, int64_t, cusolverMpMatrixDescriptor_t, void*, int64_t, int64_t,                    \
     cusolverMpMatrixDescriptor_t, cudaDataType, void*, size_t, void*, size_t, int*))

// The function table a loader fills with dlsym; the GESVD members stay null where the library
// lacks them.
struct MpApi {
#define JAXMG_MP_API_MEMBER(ret, name, params) ret(*name) params = nullptr;
  JAXMG_NCCL_FUNCTIONS(JAXMG_MP_API_MEMBER)
  JAXMG_CUSOLVERMP_FUNCTIONS(JAXMG_MP_API_MEMBER)
  JAXMG_CUSOLVERMP_GESVD_FUNCTIONS(JAXMG_MP_API_MEMBER)
#undef JAXMG_MP_API_MEMBER
};

}  // namespace jaxmg::cuda

#endif  // JAXMG_CUSOLVERMP_API_H_
