// Stand-ins for the CUDA runtime and cuSolverMg that export every function jaxmg's loader
// binds (the lists in packages/jaxmg-cuda/csrc/vendor/cuda_api.h) and do nothing: enough to see
// which libraries the loader maps, never called. Built once per soname by
// tests/native/test_cuda_loader.py.
#include "vendor/cuda_api.h"

namespace jaxmg::cuda {
namespace {
template <typename T>
T Zero() {
  return T();
}
}  // namespace

extern "C" {
#define JAXMG_STUB(ret, name, params) \
  ret name params { return Zero<ret>(); }
JAXMG_CUDART_FUNCTIONS(JAXMG_STUB)
JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_STUB)
#undef JAXMG_STUB
}
}  // namespace jaxmg::cuda
