// Compiled only when CMake finds the real cusolverMg.h: our declarations must match it.
#include <cusolverMg.h>

#include "cuda_api.h"

namespace c = jaxmg::cuda;
static_assert(static_cast<int>(::CUDA_R_32F) == c::CUDA_R_32F);
static_assert(static_cast<int>(::CUDA_R_64F) == c::CUDA_R_64F);
static_assert(static_cast<int>(::CUDA_C_32F) == c::CUDA_C_32F);
static_assert(static_cast<int>(::CUDA_C_64F) == c::CUDA_C_64F);
static_assert(static_cast<int>(::CUBLAS_FILL_MODE_LOWER) == c::CUBLAS_FILL_MODE_LOWER);
static_assert(static_cast<int>(::CUSOLVER_EIG_MODE_VECTOR) == c::CUSOLVER_EIG_MODE_VECTOR);
static_assert(static_cast<int>(::CUSOLVER_EIG_MODE_NOVECTOR) == c::CUSOLVER_EIG_MODE_NOVECTOR);
static_assert(static_cast<int>(::CUDALIBMG_GRID_MAPPING_COL_MAJOR) ==
              c::CUDALIBMG_GRID_MAPPING_COL_MAJOR);
static_assert(static_cast<int>(::cudaMemcpyDefault) == c::cudaMemcpyDefault);
static_assert(static_cast<int>(::cudaErrorPeerAccessAlreadyEnabled) ==
              c::cudaErrorPeerAccessAlreadyEnabled);
static_assert(static_cast<int>(::CUSOLVER_STATUS_SUCCESS) == c::CUSOLVER_STATUS_SUCCESS);
// Signatures: the real functions convert to our pointer types once enums are cast away.
static_assert(sizeof(::cusolverMgHandle_t) == sizeof(c::cusolverMgHandle_t));
static_assert(sizeof(::cudaLibMgGrid_t) == sizeof(c::cudaLibMgGrid_t));
static_assert(sizeof(::cudaDataType) == sizeof(c::cudaDataType));
static_assert(sizeof(::cublasFillMode_t) == sizeof(c::cublasFillMode_t));
static_assert(sizeof(::cusolverEigMode_t) == sizeof(c::cusolverEigMode_t));
