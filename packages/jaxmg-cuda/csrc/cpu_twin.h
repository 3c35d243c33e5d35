#ifndef JAXMG_CPU_TWIN_H_
#define JAXMG_CPU_TWIN_H_

#include <string>

#include "xla/ffi/api/ffi.h"

namespace jaxmg {
// Register one LAPACK routine by its scipy name (e.g. "dpotrf").
void RegisterLapack(const std::string& name, void* fn);
}  // namespace jaxmg

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotrsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgPotriCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgSyevdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmgProbeCpu);

#endif  // JAXMG_CPU_TWIN_H_
