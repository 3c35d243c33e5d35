// The routine table (routines.h): one row per FFI target.
#include "base/routines.h"

#include <vector>

namespace jaxmg {

const std::vector<Routine>& Routines() {
  static const auto* table = new std::vector<Routine>{
      {Op::kPotrs, "potrs", {Step::kPotrf, Step::kPotrs}, Result::kFactor, kRhs},
      {Op::kPotri, "potri", {Step::kPotrf, Step::kPotri}, Result::kMatrix, kNoExtra},
      {Op::kSyevd, "syevd", {Step::kSyevd}, Result::kMatrix, kEigenvalues},
      {Op::kPotrf, "potrf", {Step::kPotrf}, Result::kFactor, kNoExtra},
      {Op::kPotrsFactored, "potrs_factored", {Step::kPotrs}, Result::kUnchanged, kRhs},
      {Op::kPotriFactored, "potri_factored", {Step::kPotri}, Result::kMatrix, kNoExtra},
      {Op::kGetrf, "getrf", {Step::kGetrf}, Result::kFactor, kPivotsOut},
      {Op::kGetrs, "getrs", {Step::kGetrs}, Result::kUnchanged, kRhs | kPivotsIn},
  };
  return *table;
}

const Routine& RoutineOf(Op op) {
  for (const Routine& r : Routines())
    if (r.op == op) return r;
  return Routines().front();  // unreachable: every Op has its row
}

}  // namespace jaxmg
