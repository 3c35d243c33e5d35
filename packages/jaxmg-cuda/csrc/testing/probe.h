// A diagnostic target for the tests (jaxmg_probe, a CPU target): all participants meet; out =
// [participants, distinct threads seen]. Shows the tests that XLA runs the handlers of one call
// concurrently.
#ifndef JAXMG_PROBE_H_
#define JAXMG_PROBE_H_

#include <xla/ffi/api/ffi.h>

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgProbeCpu);

#endif  // JAXMG_PROBE_H_
