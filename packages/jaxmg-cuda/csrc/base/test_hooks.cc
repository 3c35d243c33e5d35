#include "base/test_hooks.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

}  // namespace jaxmg
