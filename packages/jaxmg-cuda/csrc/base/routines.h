// The routines: what each FFI target hands the library and gets back, in one table.
//
// A target (jaxmg_potrs, jaxmg_getrs, ...) is a short list of library steps run by the leader
// for every device, plus the operands its participants bring. The protocol
// (meeting/protocol.cc, meeting/crossprocess.cc) reads only this table, never a target's name;
// each step has one LAPACK implementation (engines/lapack_twin.cc) and one cuSolverMg
// implementation (engines/cusolvermg.cc). A new routine is a row of the table (routines.cc) and
// its handlers in ffi/handlers.cc, a step in each of those two engines if it needs a new library
// call, and its declarations in vendor/cuda_api.h.
#ifndef JAXMG_ROUTINES_H_
#define JAXMG_ROUTINES_H_

#include <string>
#include <utility>
#include <vector>

namespace jaxmg {

// One library call, named by its LAPACK routine (cuSolverMg uses the same names).
enum class Step { kPotrf, kPotrs, kPotri, kSyevd, kGetrf, kGetrs };

// The FFI targets.
enum class Op {
  kPotrs,          // jaxmg_potrs: factor A and solve (LAPACK posv)
  kPotri,          // jaxmg_potri: factor A and invert
  kSyevd,          // jaxmg_syevd: eigenvalues (and vectors)
  kPotrf,          // jaxmg_potrf: the Cholesky factor alone
  kPotrsFactored,  // jaxmg_potrs_factored: solve with a Cholesky factor
  kPotriFactored,  // jaxmg_potri_factored: invert from a Cholesky factor
  kGetrf,          // jaxmg_getrf: LU factor with partial pivoting, and the pivots
  kGetrs,          // jaxmg_getrs: solve with an LU factor (op(A) = A, A^T or A^H)
};

// What `a` holds when the call returns.
enum class Result {
  kFactor,     // a factor, left in the block-cyclic layout (to_cyclic moves, if any, applied)
  kMatrix,     // a matrix the caller wants in its own layout: from_cyclic moves applied
  kUnchanged,  // the input factor, read only
};

// Pivots of an LU factor: int32 [L] per position, distributed like A's columns (entry l of a
// position belongs to its local column l), 1-based global row indices as LAPACK's ipiv.
enum class Pivots { kNone, kOut, kIn };

// Operands besides `a`, the position and the status.
enum Extra : unsigned {
  kNoExtra = 0,
  kRhs = 1,          // b in, x out: [nrhs, N], the same on every position
  kPivotsOut = 2,    // Pivots::kOut
  kPivotsIn = 4,     // Pivots::kIn
  kEigenvalues = 8,  // w out: [N] real, the same on every position
};

struct Routine {
  Routine(Op op, std::string name, std::vector<Step> steps, Result result, unsigned extra)
      : op(op),
        name(name),
        target("jaxmg_" + name),
        steps(std::move(steps)),
        rhs(extra & kRhs),
        pivots(extra & kPivotsOut  ? Pivots::kOut
               : extra & kPivotsIn ? Pivots::kIn
                                   : Pivots::kNone),
        eigenvalues(extra & kEigenvalues),
        result(result) {}

  // Starts from a factor a previous call made (potrs_factored, potri_factored, getrs).
  bool StartsFromFactor() const {
    const Step first = steps.front();
    return first == Step::kPotrs || first == Step::kPotri || first == Step::kGetrs;
  }

  Op op;
  std::string name;         // for messages: "potrs"
  std::string target;       // the FFI target: "jaxmg_potrs"
  std::vector<Step> steps;  // in order; the next runs only while info == 0
  bool rhs;
  Pivots pivots;
  bool eigenvalues;
  Result result;
};

// Every routine, one row per Op.
const std::vector<Routine>& Routines();
const Routine& RoutineOf(Op op);

}  // namespace jaxmg

#endif  // JAXMG_ROUTINES_H_
