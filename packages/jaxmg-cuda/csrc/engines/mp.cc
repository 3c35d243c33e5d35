// Backend "mp": the checks both engines make of one process's operands (mp.h).
#include "engines/mp.h"

#include <string>

namespace jaxmg {

std::string CheckMpOperands(const Operands& o, const MpGrid& g, int64_t position, Dtype* dtype) {
  const std::string target = o.target;
  auto type = DtypeOf(o.a->element_type());
  if (!type)
    return target + ": unsupported dtype; expected float32, float64, complex64 or complex128";
  *dtype = *type;
  if (o.a->dimensions().size() != 2)
    return target + ": the local array must have rank 2 ([C, LLD]), got rank " +
           std::to_string(o.a->dimensions().size());
  if (g.rows < 1 || g.cols < 1)
    return target + ": the grid must have positive dimensions, got " + std::to_string(g.rows) +
           "x" + std::to_string(g.cols);
  if (position < 0 || position >= g.rows * g.cols)
    return target + ": position " + std::to_string(position) + " is outside the " +
           std::to_string(g.rows) + "x" + std::to_string(g.cols) + " grid";
  if (o.tile < 1) return target + ": T_A must be positive, got " + std::to_string(o.tile);
  if (g.n < 1) return target + ": N must be positive";
  if (std::string sizes = CheckLibrarySizes(g.n, o.a->dimensions()[1], o.tile, 0); !sizes.empty())
    return target + ": " + sizes;
  if (o.routine->rhs && (o.x_dims.size() != 2 || o.x_dims[1] != g.n))
    return target + ": b must be [nrhs, N] with N=" + std::to_string(g.n);
  if (o.routine->eigenvalues &&
      (o.w_dims.size() != 1 || o.w_dims[0] != g.n || o.w_type != RealTypeOf(*type)))
    return target + ": w must be [N] of A's real dtype";
  return "";
}

}  // namespace jaxmg
