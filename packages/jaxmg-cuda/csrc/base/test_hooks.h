// Test hooks: what the tests use to provoke what real runs rarely do. Nothing here runs
// unless its environment variable is set (the tests set them); no routine reads them itself.
#ifndef JAXMG_TESTING_H_
#define JAXMG_TESTING_H_

#include <cstdint>

#include <xla/ffi/api/ffi.h>

namespace jaxmg {

// JAXMG_TEST_DELAY="POSITION:SECONDS[:TIMES]": the participant at mesh position POSITION
// sleeps SECONDS before it joins its meeting, in its first TIMES calls of this process (every
// call without TIMES). Lets tests make one participant arrive late.
void DelayForTests(int32_t position);

// JAXMG_TEST_MP_LATE="CALL_ID:SECONDS": backend "mp"'s call with trace-time id CALL_ID sleeps
// SECONDS before this process learns of it. Set in one process only, it makes the processes
// start a program's independent calls in different orders (scalapack.cc).
void MpLateForTests(int64_t call_id);

// JAXMG_TEST_ILLEGAL_LDA=1: the LAPACK twin passes an illegal leading dimension, to provoke
// LAPACK's info < 0 (an error, never a status).
bool IllegalLeadingDimensionForTests();

// JAXMG_TEST_SHARE_BY_HANDLE=1: the CPU twin takes the GPU branch of the cross-process
// protocol (cpu_twin.cc).
bool ShareByHandleForTests();

}  // namespace jaxmg

// A diagnostic target: all participants meet; out = [participants, distinct threads seen].
// Shows the tests that XLA runs the handlers of one call concurrently.
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgProbeCpu);

#endif  // JAXMG_TESTING_H_
