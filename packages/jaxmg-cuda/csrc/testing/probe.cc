// The probe target (probe.h): the participants of one call meet and count the threads they
// arrived on.
#include "testing/probe.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "base/common.h"
#include "meeting/rendezvous.h"

namespace jaxmg {

ffi::Error ProbeCpu(ffi::RunId run, ffi::Buffer<ffi::S32> position,
                    ffi::Result<ffi::Buffer<ffi::S32>> out, ffi::Span<const int64_t> device_ids,
                    int64_t call_id) {
  const int ndev = static_cast<int>(std::max<size_t>(device_ids.size(), 1));
  auto meeting = Registry::Get().Join(
      MeetingKey("jaxmg_probe", device_ids, call_id, /*instance=*/0, run.run_id), ndev,
      /*exact=*/true);
  const int32_t pos = position.typed_data()[0];
  Slot slot;
  slot.thread = std::hash<std::thread::id>()(std::this_thread::get_id());
  Outcome own;
  if (pos < 0 || pos >= ndev || !meeting->Claim(pos, slot))
    own = Outcome::Fail("jaxmg_probe: bad or duplicate position " + std::to_string(pos));
  Outcome r = meeting->Phase(0, own, [&] {
    std::set<uint64_t> threads;
    for (const Slot& s : meeting->Slots()) threads.insert(s.thread);
    meeting->info = static_cast<int32_t>(threads.size());
    return Outcome{};
  });
  if (!r.ok) return Fail(r.message);
  out->typed_data()[0] = ndev;
  out->typed_data()[1] = meeting->info;
  return ffi::Error::Success();
}

}  // namespace jaxmg

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgProbeCpu, jaxmg::ProbeCpu,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()                  // the execution
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // position []
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()  // [ndev, threads]
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));
