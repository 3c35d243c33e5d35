// The ScaLAPACK binding that backend "mp"'s CPU engine shares between its square routines
// (scalapack.cc) and its rectangular ones (scalapack_rect.cc): the library's symbols, found in
// the process with dlsym, the element types, ScaLAPACK's NUMROC, and the process-wide Engine that
// puts the calls of every process in one order and builds their grids (scalapack_engine.cc).
// Internal to the engine's files: namespace jaxmg::scalapack.
#ifndef JAXMG_SCALAPACK_ENGINE_H_
#define JAXMG_SCALAPACK_ENGINE_H_

#include <dlfcn.h>

#include <complex>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/outcome.h"
#include "base/test_hooks.h"
#include "engines/mp.h"

namespace jaxmg::scalapack {

using Int = int;  // MKL's LP64 interface

// --- the library's symbols, found in the process (Python opened them RTLD_GLOBAL) ----------

inline void* Symbol(const std::string& name) { return dlsym(RTLD_DEFAULT, name.c_str()); }

template <typename Fn>
Fn Typed(const std::string& name) {
  return reinterpret_cast<Fn>(Symbol(name));
}

using BlacsPinfo = void (*)(Int* me, Int* count);
using BlacsGet = void (*)(const Int* context, const Int* what, Int* value);
using BlacsGridinit = void (*)(Int* context, const char* order, const Int* rows, const Int* cols);
using BlacsGridmap = void (*)(Int* context, const Int* map, const Int* ld, const Int* rows,
                              const Int* cols);
using BlacsGridinfo = void (*)(const Int* context, Int* rows, Int* cols, Int* row, Int* col);
using Descinit = void (*)(Int* desc, const Int* m, const Int* n, const Int* mb, const Int* nb,
                          const Int* rsrc, const Int* csrc, const Int* context, const Int* lld,
                          Int* info);
using Igamx2d = void (*)(const Int* context, const char* scope, const char* top, const Int* m,
                         const Int* n, Int* a, const Int* lda, Int* ra, Int* ca, const Int* ldia,
                         const Int* rdest, const Int* cdest);
using Igsum2d = void (*)(const Int* context, const char* scope, const char* top, const Int* m,
                         const Int* n, Int* a, const Int* lda, const Int* rdest, const Int* cdest);
using Gsum2d = void (*)(const Int* context, const char* scope, const char* top, const Int* m,
                        const Int* n, void* a, const Int* lda, const Int* rdest, const Int* cdest);

inline const char* const kBlacs[] = {
    "blacs_pinfo_", "blacs_get_", "blacs_gridinit_", "blacs_gridmap_",
    "blacs_gridinfo_", "descinit_", "igamx2d_", "igsum2d_",
    "sgsum2d_", "dgsum2d_", "cgsum2d_", "zgsum2d_"};

// --- element types -------------------------------------------------------------------------

template <typename T>
struct Scalar;
template <>
struct Scalar<float> {
  static constexpr char kPrefix = 's';
  using Real = float;
};
template <>
struct Scalar<double> {
  static constexpr char kPrefix = 'd';
  using Real = double;
};
template <>
struct Scalar<std::complex<float>> {
  static constexpr char kPrefix = 'c';
  using Real = float;
};
template <>
struct Scalar<std::complex<double>> {
  static constexpr char kPrefix = 'z';
  using Real = double;
};
template <typename T>
constexpr bool kComplex = !std::is_same_v<T, typename Scalar<T>::Real>;

template <typename T>
std::string Name(const char* routine) {
  return std::string("p") + Scalar<T>::kPrefix + routine + "_";
}

// ScaLAPACK's NUMROC for a grid origin of 0: how many of `n` rows (columns) in tiles of `nb`
// process row (column) `p` of `procs` holds.
inline Int Numroc(Int n, Int nb, Int p, Int procs) {
  const Int tiles = n / nb;
  Int count = (tiles / procs) * nb;
  const Int extra = tiles % procs;
  if (p < extra) {
    count += nb;
  } else if (p == extra) {
    count += n % nb;
  }
  return count;
}

// --- grids and the order of calls ------------------------------------------------------------

// A call's place in the order of calls: (trace-time call id, instance), lexicographic.
using CallOrder = std::pair<int64_t, int64_t>;

// One per process (Get): the calls of this process, in the order of calls of every process.
//
// Order. ScaLAPACK's routines are collectives: every process of a grid must enter the same
// routine in the same order. XLA:CPU runs independent operations of one program concurrently,
// so two independent jaxmg calls of one program may start in different orders on different
// processes. Before each call the processes agree on it: each proposes the smallest call it
// has waiting, by (trace-time call id, instance) in lexicographic order (a program's ids are
// the same on every process, since every process traces the same program; the instance tells
// apart the HLO instructions of one call id and is the same on every process too, ffi/instance.h),
// and one BLACS max-reduction over every process tells them whether they all proposed the
// same. If not, a process whose proposal was larger than another's steps back until a smaller
// call of its own arrives, and the processes with the smallest proposal ask again. The
// smallest proposal present anywhere only grows, so they converge; a call runs only when every
// process proposed it. A wait for a call to arrive in this process has
// the deadline of every jaxmg wait (JAXMG_TIMEOUT_S). A wait inside MPI has none: a process
// that dies makes `mpiexec` end the job.
class Engine {
 public:
  static Engine& Get();

  // How many times a call of this process stepped back for a smaller one (for the tests).
  int64_t StepBacks() {
    std::lock_guard<std::mutex> lock(mu_);
    return step_backs_;
  }

  // Runs `fn` once every process agreed on call `id` (class comment); `fn` gets the BLACS
  // context of the grid, built on first use.
  template <typename Fn>
  Outcome Run(CallOrder id, const MpGrid& grid, int64_t position, Fn&& fn) {
    MpLateForTests(id.first);
    std::unique_lock<std::mutex> lock(mu_);
    waiting_.insert(id);
    ++changes_;
    cv_.notify_all();
    uint64_t stepped_back_at = kNever;  // changes_ when this call last stepped back
    Outcome out;
    while (true) {
      if (Outcome r = WaitForTurn(lock, id, stepped_back_at); !r.ok) {
        out = r;
        break;
      }
      busy_ = true;
      lock.unlock();
      Proposals proposals;
      out = Agree(id, &proposals);
      if (out.ok && proposals.Unanimous()) {
        Int context = -1;
        out = GridContext(grid, position, &context);
        if (out.ok) out = fn(context);
        lock.lock();
        busy_ = false;
        break;
      }
      lock.lock();
      busy_ = false;
      if (!out.ok) break;
      // Another process proposed a smaller call: step back until this process's waiting calls
      // change (that one arrives here and goes first). Ours was the smallest: ask again.
      const bool smaller = proposals.SmallerThan(id);
      stepped_back_at = smaller ? changes_ : kNever;
      step_backs_ += smaller ? 1 : 0;
      cv_.notify_all();
    }
    waiting_.erase(waiting_.find(id));
    ++changes_;
    cv_.notify_all();
    return out;
  }

 private:
  // Every process of the job: the world grid the agreement runs on, built on first use (a
  // collective every process enters at its first call, whichever call that is).
  Outcome World(Int* context);

  static constexpr uint64_t kNever = ~uint64_t{0};

  // Until no other call of this process runs, `id` is the smallest waiting one, and (after a
  // step back) something changed. Fails after JAXMG_TIMEOUT_S without any progress here; a
  // call of this process running the library is progress, however long it takes.
  Outcome WaitForTurn(std::unique_lock<std::mutex>& lock, CallOrder id, uint64_t stepped_back_at);

  // The proposals of every process, each part of (call id, instance) on its own: its largest
  // and smallest value over every process.
  struct Proposals {
    int64_t largest[2] = {0, 0};
    int64_t smallest[2] = {0, 0};
    bool Unanimous() const { return largest[0] == smallest[0] && largest[1] == smallest[1]; }
    // Whether some process proposed a call before `id`: a smaller call id, or, when every
    // process proposed `id`'s call id, a smaller instance.
    bool SmallerThan(CallOrder id) const {
      if (smallest[0] != id.first) return smallest[0] < id.first;
      return largest[0] == id.first && smallest[1] < id.second;
    }
  };

  // One max-reduction over every process of (id, kTop - id) for each part of `id`.
  Outcome Agree(CallOrder id, Proposals* out);

  // The grid's BLACS context, built on first use. The processes first tell each other their
  // positions (one sum over every process of a map holding only this process's rank + 1).
  Outcome GridContext(const MpGrid& grid, int64_t position, Int* context);

  std::mutex mu_;
  std::condition_variable cv_;
  std::multiset<CallOrder> waiting_;
  bool busy_ = false;
  uint64_t changes_ = 0;  // arrivals and departures of this process's calls
  int64_t step_backs_ = 0;
  std::mutex world_mu_;
  Int world_ = -1;
  Int world_size_ = 0;
  Int rank_ = -1;
  std::map<std::vector<int64_t>, Int> grids_;
};

inline void FillNaN(void* data, size_t bytes) { std::memset(data, 0xFF, bytes); }

}  // namespace jaxmg::scalapack

#endif  // JAXMG_SCALAPACK_ENGINE_H_
