// What every step below the FFI handlers returns: success, or a message saying what failed.
// The meeting turns a participant's failure into the same ffi::Error on every participant.
#ifndef JAXMG_OUTCOME_H_
#define JAXMG_OUTCOME_H_

#include <string>
#include <utility>

namespace jaxmg {

// Result of a step (a meeting phase, a library call, a copy) for one participant.
struct Outcome {
  bool ok = true;
  std::string message;
  static Outcome Fail(std::string m) { return Outcome{false, std::move(m)}; }
};

}  // namespace jaxmg

#endif  // JAXMG_OUTCOME_H_
