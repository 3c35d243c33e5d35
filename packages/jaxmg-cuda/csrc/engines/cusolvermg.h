// The engine of the CUDA platform: cuSolverMg, called by the leader for all devices
// (engines/cusolvermg.cc). What has run on GPU hardware and what has not: see
// platforms/cuda_targets.cc.
#ifndef JAXMG_CUSOLVERMG_H_
#define JAXMG_CUSOLVERMG_H_

#include <memory>

#include "base/backend.h"
#include "vendor/cuda_api.h"

namespace jaxmg {

// The leader's cuSolverMg calls for all devices.
std::unique_ptr<Backend> MakeCudaBackend(const cuda::Api* api);

}  // namespace jaxmg

#endif  // JAXMG_CUSOLVERMG_H_
