#include "base/test_hooks.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "base/common.h"
#include "meeting/rendezvous.h"

namespace jaxmg {
namespace {

bool Set(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

void DelayForTests(int32_t position) {
  static std::atomic<int64_t> delayed{0};
  const char* text = std::getenv("JAXMG_TEST_DELAY");
  if (text == nullptr || *text == '\0') return;
  long long at = -1, times = -1;
  double seconds = 0;
  const int got = std::sscanf(text, "%lld:%lf:%lld", &at, &seconds, &times);
  if (got < 2 || at != position || seconds <= 0) return;
  if (got == 3 && delayed.fetch_add(1) >= times) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

void MpLateForTests(int64_t call_id) {
  const char* text = std::getenv("JAXMG_TEST_MP_LATE");
  if (text == nullptr || *text == '\0') return;
  long long id = -1;
  double seconds = 0;
  if (std::sscanf(text, "%lld:%lf", &id, &seconds) != 2 || id != call_id || seconds <= 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

bool IllegalLeadingDimensionForTests() { return Set("JAXMG_TEST_ILLEGAL_LDA"); }

bool ShareByHandleForTests() { return Set("JAXMG_TEST_SHARE_BY_HANDLE"); }

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
