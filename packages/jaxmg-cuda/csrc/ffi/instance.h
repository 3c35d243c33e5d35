// Which HLO instruction a handler runs for: the run-time identity of one copy of a call.
//
// A call's `call_id` attribute is assigned when the call is traced (jaxmg_cuda/_ops.py,
// mp.py), and one traced call can become several independent HLO instructions with the same
// attributes: JAX lowers a jitted function that a program calls twice to one function called
// twice, and XLA inlines both calls. The participants of one copy must meet each other and not
// those of another copy, which the devices may run in another order.
//
// XLA calls a handler's instantiate stage once per instruction when it builds the executable,
// keeps the state it returns with that instruction and passes it to every execution of the
// instruction (ffi::State<T> in the execute binding): XLA:CPU in CustomCallThunk::Create
// (xla/backends/cpu/runtime/custom_call_thunk.cc). Only the CPU targets need it: XLA:CPU runs
// a device's independent instructions in any order, XLA:GPU each GPU's in the program's
// schedule (the CUDA targets take no instance: handlers.cc). The instantiate handler numbers the
// instructions of each call id in the order they are instantiated in this process: the k-th
// gets `index` k, and the meeting key holds (call_id, index) (base/common.h, MeetingKey).
//
// The number is the same
//  - on every device of one process: PJRT builds one executable for all partitions of an SPMD
//    program, so every device runs the same instruction with the same state (on CPU the
//    devices meeting at all shows it: tests/api/test_repeated_calls.py);
//  - in every process of a job (multi-process mode, meeting/crossprocess.h; backend "mp",
//    engines/scalapack.h), provided the processes build the same executables in the same order, as
//    they trace the same programs in the same order for call ids to agree. XLA creates one
//    executable's thunks in the order of its schedule, the same for the same program.
#ifndef JAXMG_INSTANCE_H_
#define JAXMG_INSTANCE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <xla/ffi/api/ffi.h>

namespace jaxmg {

namespace ffi = xla::ffi;

// The ids of the two families of targets come from separate counters (jaxmg_<name>:
// _ops.py; jaxmg_mp_<name>: mp.py), so each numbers its instructions on its own.
enum class Family { kMg, kMp };

// The `index` of the next instruction of `call_id` (0 for the first).
int64_t NextInstance(Family family, int64_t call_id);

struct Instance {
  // Set once by the instantiate stage on XLA's compiler thread, read by every execution on
  // XLA's run threads: XLA orders the two, in code ThreadSanitizer cannot see, so the field
  // is atomic to say so.
  std::atomic<int64_t> index{0};
  int64_t Index() const { return index.load(std::memory_order_acquire); }
};

// The state type, registered with XLA:CPU (jax.ffi.register_ffi_type); its id is in
// instance.cc.
struct CpuInstance : Instance {
  static ffi::TypeId id;
};

// The instantiate stage of every target of `family`: reads the `call_id` attribute (the
// others are ignored) and numbers the instruction.
template <typename T, Family family>
ffi::ErrorOr<std::unique_ptr<T>> Instantiate(ffi::Dictionary attrs) {
  ffi::ErrorOr<int64_t> call_id = attrs.get<int64_t>("call_id");
  if (call_id.has_error()) return ffi::Unexpected<ffi::Error>(call_id.error());
  auto state = std::make_unique<T>();
  state->index.store(NextInstance(family, call_id.value()), std::memory_order_release);
  return state;
}

}  // namespace jaxmg

#endif  // JAXMG_INSTANCE_H_
