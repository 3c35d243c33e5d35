// Test hooks: what the tests use to provoke what real runs rarely do. The meeting, the engines
// and the CPU platform call them, so they sit below all three; nothing here runs unless its
// environment variable is set (the tests set them); no routine reads them itself. The
// test-only entry points (targets, RunCudaOnHost) are in testing/.
#ifndef JAXMG_TEST_HOOKS_H_
#define JAXMG_TEST_HOOKS_H_

#include <cstdint>

namespace jaxmg {

// JAXMG_TEST_DELAY="POSITION:SECONDS[:TIMES]": the participant at mesh position POSITION
// sleeps SECONDS before it joins its meeting, in its first TIMES calls of this process (every
// call without TIMES). Lets tests make one participant arrive late.
void DelayForTests(int32_t position);

// JAXMG_TEST_MP_LATE="CALL_ID:SECONDS": backend "mp"'s call with trace-time id CALL_ID sleeps
// SECONDS before this process learns of it. Set in one process only, it makes the processes
// start a program's independent calls in different orders (engines/scalapack.cc).
void MpLateForTests(int64_t call_id);

// JAXMG_TEST_ILLEGAL_LDA=1: the LAPACK twin passes an illegal leading dimension, to provoke
// LAPACK's info < 0 (an error, never a status).
bool IllegalLeadingDimensionForTests();

// JAXMG_TEST_SHARE_BY_HANDLE=1: the CPU twin takes the GPU branch of the cross-process
// protocol (platforms/cpu_twin.cc).
bool ShareByHandleForTests();

}  // namespace jaxmg

#endif  // JAXMG_TEST_HOOKS_H_
