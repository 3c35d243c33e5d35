#include "ffi/instance.h"

#include <map>
#include <mutex>
#include <utility>

namespace jaxmg {

// Fixed ids, not ids XLA assigns: XLA checks a handler's state type when the handler is
// registered, and when jaxmg is imported before the CPU backend starts, jax registers the
// pending targets before the pending types (jaxlib/xla_client.py, make_cpu_client). A type
// registered with an id already set keeps it (xla/ffi/ffi_api.cc, XLA_FFI_Type_Register).
// The values ("jaxmg" and a number) stay far from the small ids XLA assigns.
ffi::TypeId CpuInstance::id = {0x6a61786d6701};

int64_t NextInstance(Family family, int64_t call_id) {
  static std::mutex mu;
  static auto* next = new std::map<std::pair<Family, int64_t>, int64_t>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  return (*next)[{family, call_id}]++;
}

}  // namespace jaxmg
