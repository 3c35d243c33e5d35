// ScaLAPACK over MPI (scalapack.h): the process-wide order of calls, the grids, and one
// function per library step on this process's local array.
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
#include "engines/scalapack.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/common.h"
#include "base/test_hooks.h"
#include "base/timeout.h"

namespace jaxmg {
namespace {

using Int = int;  // MKL's LP64 interface

// --- the library's symbols, found in the process (Python opened them RTLD_GLOBAL) ----------

void* Symbol(const std::string& name) { return dlsym(RTLD_DEFAULT, name.c_str()); }

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

const char* const kBlacs[] = {"blacs_pinfo_",    "blacs_get_", "blacs_gridinit_", "blacs_gridmap_",
                              "blacs_gridinfo_", "descinit_",  "igamx2d_",        "igsum2d_",
                              "sgsum2d_",        "dgsum2d_",   "cgsum2d_",        "zgsum2d_"};

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
Int Numroc(Int n, Int nb, Int p, Int procs) {
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

class Engine {
 public:
  static Engine& Get() {
    static auto* engine = new Engine();
    return *engine;
  }

  // How many times a call of this process stepped back for a smaller one (for the tests).
  int64_t StepBacks() {
    std::lock_guard<std::mutex> lock(mu_);
    return step_backs_;
  }

  // Runs `fn` once every process agreed on call `id` (file comment); `fn` gets the BLACS
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
  Outcome World(Int* context) {
    if (world_ < 0) {
      Int me = 0, count = 0, zero = 0, minus_one = -1, one = 1;
      Typed<BlacsPinfo>("blacs_pinfo_")(&me, &count);
      if (count < 1) return Outcome::Fail("BLACS reports no MPI processes: is MPI initialised?");
      Int ctx = 0;
      Typed<BlacsGet>("blacs_get_")(&minus_one, &zero, &ctx);
      Typed<BlacsGridinit>("blacs_gridinit_")(&ctx, "R", &one, &count);
      world_ = ctx;
      world_size_ = count;
      rank_ = me;
    }
    *context = world_;
    return {};
  }

  static constexpr uint64_t kNever = ~uint64_t{0};

  // Until no other call of this process runs, `id` is the smallest waiting one, and (after a
  // step back) something changed. Fails after JAXMG_TIMEOUT_S without any progress here; a
  // call of this process running the library is progress, however long it takes.
  Outcome WaitForTurn(std::unique_lock<std::mutex>& lock, CallOrder id,
                      uint64_t stepped_back_at) {
    auto ready = [&] { return !busy_ && *waiting_.begin() == id && changes_ != stepped_back_at; };
    const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(TimeoutSeconds()));
    uint64_t progress = changes_;
    while (!ready()) {
      if (cv_.wait_for(lock, timeout, ready)) break;
      if (!busy_ && changes_ == progress) {
        return Outcome::Fail(
            "timed out after " + std::to_string(TimeoutSeconds()) + " s (JAXMG_TIMEOUT_S) " +
            "waiting for the call the other processes run first (before trace-time call id " +
            std::to_string(id.first) + ", instance " + std::to_string(id.second) +
            ") to start in this process: do all processes run the same program?");
      }
      progress = changes_;
    }
    return {};
  }

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
  Outcome Agree(CallOrder id, Proposals* out) {
    Int world = -1;
    {
      std::lock_guard<std::mutex> lock(world_mu_);
      if (Outcome r = World(&world); !r.ok) return r;
    }
    // BLACS's "max" is the largest *absolute* value: keep every entry non-negative.
    constexpr Int kTop = std::numeric_limits<Int>::max() / 2;
    const int64_t parts[2] = {id.first, id.second};
    Int values[4];
    for (int i = 0; i < 2; ++i) {
      if (parts[i] < 0 || parts[i] > kTop) return Outcome::Fail("call id out of range");
      values[2 * i] = static_cast<Int>(parts[i]);
      values[2 * i + 1] = kTop - static_cast<Int>(parts[i]);
    }
    Int four = 4, one = 1, flag = -1, all = -1, none = 0;
    Typed<Igamx2d>("igamx2d_")(&world, "A", " ", &four, &one, values, &four, nullptr, nullptr,
                               &flag, &all, &none);
    for (int i = 0; i < 2; ++i) {
      out->largest[i] = values[2 * i];
      out->smallest[i] = kTop - values[2 * i + 1];
    }
    return {};
  }

  // The grid's BLACS context, built on first use. The processes first tell each other their
  // positions (one sum over every process of a map holding only this process's rank + 1).
  Outcome GridContext(const MpGrid& grid, int64_t position, Int* context) {
    const int64_t count = grid.rows * grid.cols;
    if (count != world_size_) {
      return Outcome::Fail("the process grid " + std::to_string(grid.rows) + "x" +
                           std::to_string(grid.cols) + " must hold every one of the job's " +
                           std::to_string(world_size_) + " MPI processes");
    }
    std::vector<Int> seen(static_cast<size_t>(count), 0);
    seen[position] = rank_ + 1;
    Int world = world_, size = static_cast<Int>(count), one = 1, all = -1, zero = 0;
    Typed<Igsum2d>("igsum2d_")(&world, "A", " ", &size, &one, seen.data(), &size, &all, &zero);
    std::vector<int64_t> key = {grid.rows, grid.cols};
    for (int64_t p = 0; p < count; ++p) {
      if (seen[p] < 1 || seen[p] > world_size_) {
        return Outcome::Fail("grid position " + std::to_string(p) + " of " +
                             std::to_string(grid.rows) + "x" + std::to_string(grid.cols) +
                             " is claimed by no process or by several: each process must bring a "
                             "distinct position");
      }
      key.push_back(seen[p] - 1);
      // MKL's p?syevd (divide and conquer) hangs on grids whose positions are not in MPI rank
      // order (seen on 1x4 and 2x2 grids); the other routines do not, but one rule is simpler.
      if (seen[p] - 1 != p) {
        return Outcome::Fail("grid position " + std::to_string(p) + " is held by MPI rank " +
                             std::to_string(seen[p] - 1) + ": backend 'mp' needs position p " +
                             "(row-major) on rank p. Order the mesh's devices by process, as "
                             "jax.make_mesh does");
      }
    }
    if (auto it = grids_.find(key); it != grids_.end()) {
      *context = it->second;
      return {};
    }
    // BLACS's map is column-major: map[r + c * rows] is the rank at grid position (r, c).
    std::vector<Int> map(static_cast<size_t>(count));
    for (int64_t r = 0; r < grid.rows; ++r)
      for (int64_t c = 0; c < grid.cols; ++c)
        map[r + c * grid.rows] = static_cast<Int>(key[2 + r * grid.cols + c]);
    Int ctx = 0, minus_one = -1;
    const Int rows = static_cast<Int>(grid.rows), cols = static_cast<Int>(grid.cols);
    Typed<BlacsGet>("blacs_get_")(&minus_one, &zero, &ctx);
    Typed<BlacsGridmap>("blacs_gridmap_")(&ctx, map.data(), &rows, &rows, &cols);
    grids_[key] = ctx;
    *context = ctx;
    return {};
  }

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

// --- one call on this process's local array ----------------------------------------------

struct Local {
  Int n, tile, lld, rows, cols;  // global order, tile, leading dimension, grid shape
  Int row, col;                  // this process's grid position
  Int local_rows, local_cols;    // what it holds of A
  Int desc[9];                   // A's descriptor
  bool blocks;                   // `a` is a block of P(r, c) (MpGrid::blocks)
  bool result_back;              // the result goes back into the block (MpGrid::result_back)
  Int blocks_desc[9];            // the descriptor of that block layout
};

template <typename T>
class Call {
 public:
  Call(const Operands& o, Local& l, Int context) : o_(o), l_(l), context_(context) {}

  Outcome Run(Int* info) {
    *info = 0;
    a_ = static_cast<T*>(o_.a_out);
    a_count_ = static_cast<size_t>(o_.a->element_count());
    if (l_.blocks) {  // the routine runs on a local array of the tiled layout of its own
      a_count_ = static_cast<size_t>(l_.lld) * std::max<Int>(1, l_.local_cols);
      tiled_.assign(a_count_, T(0));
      Redistribute(static_cast<T*>(o_.a_out), l_.blocks_desc, tiled_.data(), l_.desc);
      a_ = tiled_.data();
    }
    if (o_.routine->rhs) ScatterRhs();
    for (Step step : o_.routine->steps) {
      if (*info != 0) break;
      Outcome r = RunStep(step, info);
      if (!r.ok) return r;
    }
    if (l_.blocks && l_.result_back && o_.routine->result != Result::kUnchanged && *info == 0)
      Redistribute(tiled_.data(), l_.desc, static_cast<T*>(o_.a_out), l_.blocks_desc);
    if (o_.routine->rhs && *info == 0) return GatherRhs();
    return {};
  }

  // p?gemr2d: the whole N x N matrix from one layout to another on the same grid.
  void Redistribute(const T* from, const Int* from_desc, T* to, const Int* to_desc) {
    using Fn = void (*)(const Int*, const Int*, const void*, const Int*, const Int*, const Int*,
                        void*, const Int*, const Int*, const Int*, const Int*);
    Int one = 1;
    Typed<Fn>(Name<T>("gemr2d"))(&l_.n, &l_.n, from, &one, &one, from_desc, to, &one, &one, to_desc,
                                 &context_);
  }

  // The right-hand sides as a distributed N x nrhs matrix: tiles of A's rows, every column in
  // process column 0 (whose processes hold them; the others hold nothing).
  void ScatterRhs() {
    nrhs_ = static_cast<Int>(o_.x_dims[0]);
    ldb_ = std::max<Int>(1, l_.local_rows);
    b_.assign(static_cast<size_t>(ldb_) * std::max<Int>(1, nrhs_), T(0));
    const T* x = static_cast<const T*>(o_.x_out);
    if (l_.col == 0) {
      for (Int j = 0; j < nrhs_; ++j)
        for (Int i = 0; i < l_.local_rows; ++i)
          b_[i + static_cast<size_t>(j) * ldb_] = x[GlobalRow(i) + static_cast<size_t>(j) * l_.n];
    }
    Int zero = 0, info = 0, nb = std::max<Int>(1, nrhs_);
    Typed<Descinit>("descinit_")(desc_b_, &l_.n, &nrhs_, &l_.tile, &nb, &zero, &zero, &context_,
                                 &ldb_, &info);
  }

  // x on every process: process column 0's rows, summed over the grid into zeros.
  Outcome GatherRhs() {
    T* x = static_cast<T*>(o_.x_out);
    std::fill(x, x + static_cast<size_t>(l_.n) * nrhs_, T(0));
    if (l_.col == 0) {
      for (Int j = 0; j < nrhs_; ++j)
        for (Int i = 0; i < l_.local_rows; ++i)
          x[GlobalRow(i) + static_cast<size_t>(j) * l_.n] = b_[i + static_cast<size_t>(j) * ldb_];
    }
    const std::string name = std::string(1, Scalar<T>::kPrefix) + "gsum2d_";
    Int all = -1, zero = 0;
    Typed<Gsum2d>(name)(&context_, "A", " ", &l_.n, &nrhs_, x, &l_.n, &all, &zero);
    return {};
  }

 private:
  Int GlobalRow(Int i) const { return ((i / l_.tile) * l_.rows + l_.row) * l_.tile + i % l_.tile; }

  Outcome RunStep(Step step, Int* info) {
    T* a = a_;
    Int one = 1;
    const char* lower = "L";
    switch (step) {
      case Step::kPotrf:
      case Step::kPotri: {
        using Fn =
            void (*)(const char*, const Int*, void*, const Int*, const Int*, const Int*, Int*);
        Typed<Fn>(Name<T>(step == Step::kPotrf ? "potrf" : "potri"))(lower, &l_.n, a, &one, &one,
                                                                     l_.desc, info);
        return {};
      }
      case Step::kPotrs: {
        using Fn =
            void (*)(const char*, const Int*, const Int*, const void*, const Int*, const Int*,
                     const Int*, void*, const Int*, const Int*, const Int*, Int*);
        Typed<Fn>(Name<T>("potrs"))(lower, &l_.n, &nrhs_, a, &one, &one, l_.desc, b_.data(), &one,
                                    &one, desc_b_, info);
        return {};
      }
      case Step::kGetrf: {
        using Fn =
            void (*)(const Int*, const Int*, void*, const Int*, const Int*, const Int*, Int*, Int*);
        Typed<Fn>(Name<T>("getrf"))(&l_.n, &l_.n, a, &one, &one, l_.desc, o_.ipiv, info);
        return {};
      }
      case Step::kGetrs: {
        using Fn =
            void (*)(const char*, const Int*, const Int*, const void*, const Int*, const Int*,
                     const Int*, const Int*, void*, const Int*, const Int*, const Int*, Int*);
        const char trans[2] = {o_.trans, '\0'};
        Typed<Fn>(Name<T>("getrs"))(trans, &l_.n, &nrhs_, a, &one, &one, l_.desc, o_.ipiv,
                                    b_.data(), &one, &one, desc_b_, info);
        return {};
      }
      case Step::kSyevd: return Syevd(a, info);
    }
    return Outcome::Fail("unknown library step");
  }

  // p?syevd / p?heevd: eigenvalues and (always: ScaLAPACK computes no values alone) vectors,
  // into a separate local array of A's shape, then over A.
  Outcome Syevd(T* a, Int* info) {
    using Real = typename Scalar<T>::Real;
    const size_t local = a_count_;
    std::vector<T> z(local);
    std::vector<Real> w(static_cast<size_t>(l_.n));
    Int one = 1, minus_one = -1;
    T work_size = T(0);
    Real rwork_size = 0;
    Int iwork_size = 0;
    auto call = [&](T* work, Int lwork, Real* rwork, Int lrwork, Int* iwork, Int liwork) {
      if constexpr (kComplex<T>) {
        using Fn = void (*)(const char*, const char*, const Int*, void*, const Int*, const Int*,
                            const Int*, void*, void*, const Int*, const Int*, const Int*, void*,
                            const Int*, void*, const Int*, Int*, const Int*, Int*);
        Typed<Fn>(Name<T>("heevd"))("V", "L", &l_.n, a, &one, &one, l_.desc, w.data(), z.data(),
                                    &one, &one, l_.desc, work, &lwork, rwork, &lrwork, iwork,
                                    &liwork, info);
      } else {
        using Fn = void (*)(const char*, const char*, const Int*, void*, const Int*, const Int*,
                            const Int*, void*, void*, const Int*, const Int*, const Int*, void*,
                            const Int*, Int*, const Int*, Int*);
        Typed<Fn>(Name<T>("syevd"))("V", "L", &l_.n, a, &one, &one, l_.desc, w.data(), z.data(),
                                    &one, &one, l_.desc, work, &lwork, iwork, &liwork, info);
      }
    };
    call(&work_size, minus_one, &rwork_size, minus_one, &iwork_size, minus_one);
    if (*info != 0) return Outcome::Fail(Name<T>("syevd") + " workspace query failed");
    // The queries are known to come out a little short on some grids: a margin.
    std::vector<T> work(static_cast<size_t>(std::real(work_size)) + 64);
    std::vector<Real> rwork(static_cast<size_t>(rwork_size) + 64);
    std::vector<Int> iwork(static_cast<size_t>(iwork_size) + 64);
    call(work.data(), static_cast<Int>(work.size()), rwork.data(), static_cast<Int>(rwork.size()),
         iwork.data(), static_cast<Int>(iwork.size()));
    if (*info == 0) {
      std::memcpy(a, z.data(), local * sizeof(T));
      std::memcpy(o_.w_out, w.data(), w.size() * sizeof(Real));
    }
    return {};
  }

  const Operands& o_;
  Local& l_;
  Int context_;
  T* a_ = nullptr;        // the local array the routine works on: `a`, or `tiled_`
  size_t a_count_ = 0;    // its elements
  std::vector<T> tiled_;  // with `blocks`: the local array in `tile`-square tiles
  std::vector<T> b_;
  Int nrhs_ = 0, ldb_ = 1;
  Int desc_b_[9] = {};
};

template <typename T>
Outcome RunTyped(const Operands& o, Local& l, Int context, Int* info) {
  Call<T> call(o, l, context);
  return call.Run(info);
}

// --- the rectangular routines (RectOp, scalapack.h) ------------------------------------------

// Where one process's tiles lie in an M x N matrix of `tile`-square tiles on the grid.
struct Tiles {
  Int m, n, tile, rows, cols, row, col;
  Int LocalRows() const { return Numroc(m, tile, row, rows); }
  Int LocalCols() const { return Numroc(n, tile, col, cols); }
  Int Lld() const { return std::max<Int>(1, LocalRows()); }
  size_t Count() const {
    return static_cast<size_t>(Lld()) * static_cast<size_t>(std::max<Int>(1, LocalCols()));
  }
  Int GlobalRow(Int i) const { return ((i / tile) * rows + row) * tile + i % tile; }
  Int GlobalCol(Int j) const { return ((j / tile) * cols + col) * tile + j % tile; }
};

template <typename T>
class RectCall {
 public:
  using Real = typename Scalar<T>::Real;
  RectCall(const RectOperands& o, Int context, Int row, Int col)
      : o_(o), context_(context), row_(row), col_(col) {}

  Outcome Run(Int* info) {
    *info = 0;
    const Int m = static_cast<Int>(o_.m), n = static_cast<Int>(o_.n);
    Tiles at = Shape(m, n);
    a_.assign(at.Count(), T(0));
    Describe(at, desc_a_);
    // The block [M/rows, N/cols] of JAX's sharding: a 2D block-cyclic layout of one tile each.
    Int block_desc[9], zero = 0, desc_info = 0, one = 1;
    Int block_rows = m / rows(), block_cols = n / cols(), block_lld = std::max<Int>(1, m / rows());
    Typed<Descinit>("descinit_")(block_desc, &m, &n, &block_rows, &block_cols, &zero, &zero,
                                 &context_, &block_lld, &desc_info);
    if (desc_info != 0) return Outcome::Fail("descinit rejected A's blocks");
    using Gemr2d = void (*)(const Int*, const Int*, const void*, const Int*, const Int*,
                            const Int*, void*, const Int*, const Int*, const Int*, const Int*);
    Typed<Gemr2d>(Name<T>("gemr2d"))(&m, &n, o_.a->untyped_data(), &one, &one, block_desc,
                                     a_.data(), &one, &one, desc_a_, &context_);
    switch (o_.op) {
      case RectOp::kGesvd: return Gesvd(at, info);
      case RectOp::kQr: return Qr(at, info);
      case RectOp::kGels: return Gels(at, info);
    }
    return Outcome::Fail("unknown routine");
  }

 private:
  Int rows() const { return static_cast<Int>(o_.rows); }
  Int cols() const { return static_cast<Int>(o_.cols); }
  Tiles Shape(Int m, Int n) const {
    return Tiles{m, n, static_cast<Int>(o_.tile), rows(), cols(), row_, col_};
  }
  void Describe(const Tiles& t, Int* desc) {
    Int zero = 0, info = 0, lld = t.Lld();
    Typed<Descinit>("descinit_")(desc, &t.m, &t.n, &t.tile, &t.tile, &zero, &zero, &context_,
                                 &lld, &info);
  }

  // The leading `out_rows x out_cols` of a distributed matrix, whole and row-major on every
  // process: each writes its own entries (those `keep` accepts) into zeros, and one sum over
  // the grid adds them up.
  template <typename Keep>
  void Gather(const Tiles& t, const T* local, Int out_rows, Int out_cols, T* out, Keep keep) {
    std::fill(out, out + static_cast<size_t>(out_rows) * out_cols, T(0));
    for (Int j = 0; j < t.LocalCols(); ++j) {
      const Int gj = t.GlobalCol(j);
      if (gj >= out_cols) continue;
      for (Int i = 0; i < t.LocalRows(); ++i) {
        const Int gi = t.GlobalRow(i);
        if (gi < out_rows && keep(gi, gj))
          out[static_cast<size_t>(gi) * out_cols + gj] = local[i + static_cast<size_t>(j) * t.Lld()];
      }
    }
    const std::string name = std::string(1, Scalar<T>::kPrefix) + "gsum2d_";
    Int all = -1, zero = 0;
    // Row-major out_rows x out_cols is column-major out_cols x out_rows.
    Typed<Gsum2d>(name)(&context_, "A", " ", &out_cols, &out_rows, out, &out_cols, &all, &zero);
  }

  static size_t Size(T query) { return static_cast<size_t>(std::real(query)) + 64; }

  Outcome Gesvd(const Tiles& at, Int* info) {
    const Int m = at.m, n = at.n, k = std::min(m, n), one = 1, minus_one = -1;
    Tiles ut = Shape(m, k), vt = Shape(k, n);
    Int desc_u[9], desc_vt[9];
    Describe(ut, desc_u);
    Describe(vt, desc_vt);
    std::vector<T> u(ut.Count()), v(vt.Count());
    std::vector<Real> s(static_cast<size_t>(k));
    // The complex routine's RWORK: 1 + 4 max(M, N) (p?gesvd's documentation), and what its
    // query asks, whichever is larger.
    std::vector<Real> rwork(1 + 4 * static_cast<size_t>(std::max(m, n)) + 64);
    auto call = [&](T* work, Int lwork) {
      if constexpr (kComplex<T>) {
        using Fn = void (*)(const char*, const char*, const Int*, const Int*, void*, const Int*,
                            const Int*, const Int*, void*, void*, const Int*, const Int*,
                            const Int*, void*, const Int*, const Int*, const Int*, void*,
                            const Int*, void*, Int*);
        Typed<Fn>(Name<T>("gesvd"))("V", "V", &m, &n, a_.data(), &one, &one, desc_a_, s.data(),
                                    u.data(), &one, &one, desc_u, v.data(), &one, &one, desc_vt,
                                    work, &lwork, rwork.data(), info);
      } else {
        using Fn = void (*)(const char*, const char*, const Int*, const Int*, void*, const Int*,
                            const Int*, const Int*, void*, void*, const Int*, const Int*,
                            const Int*, void*, const Int*, const Int*, const Int*, void*,
                            const Int*, Int*);
        Typed<Fn>(Name<T>("gesvd"))("V", "V", &m, &n, a_.data(), &one, &one, desc_a_, s.data(),
                                    u.data(), &one, &one, desc_u, v.data(), &one, &one, desc_vt,
                                    work, &lwork, info);
      }
    };
    T query = T(0);
    call(&query, minus_one);
    if (*info != 0) return Outcome::Fail(Name<T>("gesvd") + " workspace query failed");
    if (kComplex<T> && static_cast<size_t>(rwork[0]) + 64 > rwork.size())
      rwork.resize(static_cast<size_t>(rwork[0]) + 64);
    std::vector<T> work(Size(query));
    call(work.data(), static_cast<Int>(work.size()));
    if (*info != 0) return {};
    auto all = [](Int, Int) { return true; };
    Gather(ut, u.data(), m, k, static_cast<T*>(o_.out0), all);
    std::memcpy(o_.out1, s.data(), s.size() * sizeof(Real));  // every process has s
    Gather(vt, v.data(), k, n, static_cast<T*>(o_.out2), all);
    return {};
  }

  Outcome Qr(const Tiles& at, Int* info) {
    const Int m = at.m, n = at.n, k = std::min(m, n), one = 1, minus_one = -1;
    std::vector<T> tau(static_cast<size_t>(at.LocalCols()) + at.tile);
    using Geqrf = void (*)(const Int*, const Int*, void*, const Int*, const Int*, const Int*,
                           void*, void*, const Int*, Int*);
    T query = T(0);
    Typed<Geqrf>(Name<T>("geqrf"))(&m, &n, a_.data(), &one, &one, desc_a_, tau.data(), &query,
                                   &minus_one, info);
    if (*info != 0) return Outcome::Fail(Name<T>("geqrf") + " workspace query failed");
    std::vector<T> work(Size(query));
    Int lwork = static_cast<Int>(work.size());
    Typed<Geqrf>(Name<T>("geqrf"))(&m, &n, a_.data(), &one, &one, desc_a_, tau.data(),
                                   work.data(), &lwork, info);
    if (*info != 0) return {};
    Gather(at, a_.data(), k, n, static_cast<T*>(o_.out1), [](Int i, Int j) { return i <= j; });
    // Q: the first K columns of the M x N array, from the reflectors there.
    using Orgqr = void (*)(const Int*, const Int*, const Int*, void*, const Int*, const Int*,
                           const Int*, const void*, void*, const Int*, Int*);
    const std::string orgqr = Name<T>(kComplex<T> ? "ungqr" : "orgqr");
    Typed<Orgqr>(orgqr)(&m, &k, &k, a_.data(), &one, &one, desc_a_, tau.data(), &query,
                        &minus_one, info);
    if (*info != 0) return Outcome::Fail(orgqr + " workspace query failed");
    work.assign(Size(query), T(0));
    lwork = static_cast<Int>(work.size());
    Typed<Orgqr>(orgqr)(&m, &k, &k, a_.data(), &one, &one, desc_a_, tau.data(), work.data(),
                        &lwork, info);
    if (*info != 0) return {};
    Gather(at, a_.data(), m, k, static_cast<T*>(o_.out0), [](Int, Int) { return true; });
    return {};
  }

  Outcome Gels(const Tiles& at, Int* info) {
    const Int m = at.m, n = at.n, one = 1, minus_one = -1;
    const Int nrhs = static_cast<Int>(o_.b->dimensions()[1]);
    // B: max(M, N) x nrhs in A's row tiles; b's M rows in, x's N rows out.
    Tiles bt = Shape(std::max(m, n), nrhs);
    std::vector<T> b(bt.Count(), T(0));
    const T* in = static_cast<const T*>(o_.b->untyped_data());
    for (Int j = 0; j < bt.LocalCols(); ++j)
      for (Int i = 0; i < bt.LocalRows(); ++i) {
        const Int gi = bt.GlobalRow(i);
        if (gi < m) b[i + static_cast<size_t>(j) * bt.Lld()] = in[static_cast<size_t>(gi) * nrhs + bt.GlobalCol(j)];
      }
    Int desc_b[9];
    Describe(bt, desc_b);
    using Fn = void (*)(const char*, const Int*, const Int*, const Int*, void*, const Int*,
                        const Int*, const Int*, void*, const Int*, const Int*, const Int*, void*,
                        const Int*, Int*);
    T query = T(0);
    Typed<Fn>(Name<T>("gels"))("N", &m, &n, &nrhs, a_.data(), &one, &one, desc_a_, b.data(),
                               &one, &one, desc_b, &query, &minus_one, info);
    if (*info != 0) return Outcome::Fail(Name<T>("gels") + " workspace query failed");
    std::vector<T> work(Size(query));
    const Int lwork = static_cast<Int>(work.size());
    Typed<Fn>(Name<T>("gels"))("N", &m, &n, &nrhs, a_.data(), &one, &one, desc_a_, b.data(), &one,
                               &one, desc_b, work.data(), &lwork, info);
    if (*info != 0) return {};
    // p?gels, unlike LAPACK's ?gels, reports no singular triangular factor: its first exactly
    // zero diagonal entry i (1-based) becomes the status, as ?gels's info. Each process looks
    // at the diagonal entries it holds; one max-reduction of K - i (0: none) tells them all.
    const Int k = std::min(m, n);
    Int zero_at = 0;
    for (Int j = 0; j < at.LocalCols(); ++j) {
      const Int gj = at.GlobalCol(j);
      if (gj >= k) continue;
      for (Int i = 0; i < at.LocalRows(); ++i)
        if (at.GlobalRow(i) == gj && a_[i + static_cast<size_t>(j) * at.Lld()] == T(0))
          zero_at = std::max(zero_at, k - gj);
    }
    Int flag = -1, all = -1, none = 0;
    Typed<Igamx2d>("igamx2d_")(&context_, "A", " ", &one, &one, &zero_at, &one, nullptr, nullptr,
                               &flag, &all, &none);
    if (zero_at > 0) {
      *info = k + 1 - zero_at;
      return {};
    }
    Gather(bt, b.data(), n, nrhs, static_cast<T*>(o_.out0), [](Int, Int) { return true; });
    return {};
  }

  const RectOperands& o_;
  Int context_, row_, col_;
  std::vector<T> a_;  // A in `tile`-square tiles
  Int desc_a_[9] = {};
};

void FillNaN(void* data, size_t bytes) { std::memset(data, 0xFF, bytes); }

}  // namespace

int64_t ScalapackStepBacks() { return Engine::Get().StepBacks(); }

std::string ScalapackMissing() {
  std::string missing;
  for (const char* name : kBlacs)
    if (Symbol(name) == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  for (const char* p : {"s", "d", "c", "z"})
    for (const char* r : {"potrf", "potrs", "potri", "getrf", "getrs", "gemr2d", "gesvd", "geqrf",
                          "gels"})
      if (Symbol(std::string("p") + p + r + "_") == nullptr)
        missing += std::string(missing.empty() ? "" : ", ") + "p" + p + r + "_";
  for (const char* name : {"pssyevd_", "pdsyevd_", "pcheevd_", "pzheevd_", "psorgqr_", "pdorgqr_",
                           "pcungqr_", "pzungqr_"})
    if (Symbol(name) == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return missing;
}

ffi::Error RunOnScalapack(const Operands& o, const MpGrid& g) {
  if (std::string missing = ScalapackMissing(); !missing.empty()) {
    return Fail(std::string(o.target) + ": ScaLAPACK is not loaded in this process (missing " +
                missing + "): call jaxmg_cuda.mp.load() first (pip install 'jaxmg[mpi]')");
  }
  if (o.position == nullptr || o.position_count != 1)
    return Fail(std::string(o.target) +
                ": position must be an int32 scalar (the flat grid position)");
  Dtype dtype;
  if (std::string error = CheckMpOperands(o, g, *o.position, &dtype); !error.empty())
    return Fail(error);
  if (o.a->untyped_data() != o.a_out) std::memcpy(o.a_out, o.a->untyped_data(), o.a->size_bytes());
  if (o.routine->rhs && o.b->untyped_data() != o.x_out)
    std::memcpy(o.x_out, o.b->untyped_data(), o.b->size_bytes());

  Int info = 0;
  const CallOrder order{o.call_id, o.instance};
  Outcome out = Engine::Get().Run(order, g, *o.position, [&](Int context) -> Outcome {
    Local l{};
    l.n = static_cast<Int>(g.n);
    l.tile = static_cast<Int>(o.tile);
    l.lld = static_cast<Int>(o.a->dimensions()[1]);
    l.blocks = g.blocks;
    l.result_back = g.result_back;
    Int rows = 0, cols = 0;
    Typed<BlacsGridinfo>("blacs_gridinfo_")(&context, &rows, &cols, &l.row, &l.col);
    if (l.row < 0 || l.col < 0) return Outcome::Fail("this process is not on the grid");
    l.rows = rows;
    l.cols = cols;
    l.local_rows = Numroc(l.n, l.tile, l.row, rows);
    l.local_cols = Numroc(l.n, l.tile, l.col, cols);
    const std::string at = std::string(o.target) + " at grid position (" + std::to_string(l.row) +
                           ", " + std::to_string(l.col) + "): ";
    Int zero = 0, desc_info = 0;
    if (l.blocks) {  // `a` is the block [N/cols, N/rows]; the routine's array is of its own
      const Int block_rows = l.n / rows, block_cols = l.n / cols;
      if (l.n % rows != 0 || l.n % cols != 0 || l.lld != block_rows ||
          o.a->dimensions()[0] != block_cols)
        return Outcome::Fail(at + "with blocks, the local array must be the block [" +
                             std::to_string(l.n / cols) + ", " + std::to_string(l.n / rows) +
                             "] of N=" + std::to_string(l.n) + " on the grid, got [" +
                             std::to_string(o.a->dimensions()[0]) + ", " + std::to_string(l.lld) +
                             "]");
      Typed<Descinit>("descinit_")(l.blocks_desc, &l.n, &l.n, &block_rows, &block_cols, &zero,
                                   &zero, &context, &l.lld, &desc_info);
      if (desc_info != 0)
        return Outcome::Fail(at + "descinit rejected the block layout (info " +
                             std::to_string(desc_info) + ")");
      l.lld = std::max<Int>(1, l.local_rows);
    } else if (l.lld < std::max<Int>(1, l.local_rows) || o.a->dimensions()[0] < l.local_cols) {
      return Outcome::Fail(at + "the local array [" + std::to_string(o.a->dimensions()[0]) + ", " +
                           std::to_string(l.lld) + "] cannot hold the " +
                           std::to_string(l.local_rows) + " x " + std::to_string(l.local_cols) +
                           " local block");
    }
    if (o.routine->pivots != Pivots::kNone &&
        o.ipiv_count < static_cast<size_t>(l.local_rows + l.tile))
      return Outcome::Fail(at + "the pivots need " + std::to_string(l.local_rows + l.tile) +
                           " entries, got " + std::to_string(o.ipiv_count));
    Typed<Descinit>("descinit_")(l.desc, &l.n, &l.n, &l.tile, &l.tile, &zero, &zero, &context,
                                 &l.lld, &desc_info);
    if (desc_info != 0)
      return Outcome::Fail(at + "descinit rejected the layout (info " + std::to_string(desc_info) +
                           ")");
    switch (dtype) {
      case Dtype::kF32: return RunTyped<float>(o, l, context, &info);
      case Dtype::kF64: return RunTyped<double>(o, l, context, &info);
      case Dtype::kC64: return RunTyped<std::complex<float>>(o, l, context, &info);
      case Dtype::kC128: return RunTyped<std::complex<double>>(o, l, context, &info);
    }
    return Outcome::Fail("unknown dtype");
  });
  if (!out.ok) return Fail(std::string(o.target) + ": " + out.message);
  if (info < 0) {
    return Fail(std::string(o.target) + ": ScaLAPACK reported illegal argument " +
                std::to_string(-info));
  }
  if (info != 0) {
    if (o.routine->rhs) FillNaN(o.x_out, o.b->size_bytes());
    if (o.routine->result != Result::kUnchanged) FillNaN(o.a_out, o.a->size_bytes());
    if (o.routine->eigenvalues) FillNaN(o.w_out, static_cast<size_t>(g.n) * RealElementSize(dtype));
  }
  o.status_out[0] = info;
  return ffi::Error::Success();
}

ffi::Error RunRectOnScalapack(const RectOperands& o) {
  const std::string target = o.target;
  if (std::string missing = ScalapackMissing(); !missing.empty()) {
    return Fail(target + ": ScaLAPACK is not loaded in this process (missing " + missing +
                "): call jaxmg_cuda.mp.load() first (pip install 'jaxmg[mpi]')");
  }
  if (o.position == nullptr || o.position_count != 1)
    return Fail(target + ": position must be an int32 scalar (the flat grid position)");
  auto type = DtypeOf(o.a->element_type());
  if (!type)
    return Fail(target + ": unsupported dtype; expected float32, float64, complex64 or complex128");
  const int64_t m = o.m, n = o.n, k = std::min(o.m, o.n), position = *o.position;
  if (o.rows < 1 || o.cols < 1 || position < 0 || position >= o.rows * o.cols)
    return Fail(target + ": position " + std::to_string(position) + " is outside the grid " +
                std::to_string(o.rows) + "x" + std::to_string(o.cols));
  if (o.tile < 1) return Fail(target + ": T_A must be positive");
  constexpr int64_t kLargest = std::numeric_limits<Int>::max() / 2;
  if (m < 1 || n < 1 || m * n > kLargest || m % o.rows != 0 || n % o.cols != 0)
    return Fail(target + ": A is " + std::to_string(m) + " x " + std::to_string(n) +
                ": both must be positive, M * N below 2^30, M divisible by the grid's " +
                std::to_string(o.rows) + " rows and N by its " + std::to_string(o.cols) +
                " columns");
  const auto& dims = o.a->dimensions();
  if (dims.size() != 2 || dims[0] != n / o.cols || dims[1] != m / o.rows)
    return Fail(target + ": the local array must be the block [N/cols, M/rows] = [" +
                std::to_string(n / o.cols) + ", " + std::to_string(m / o.rows) + "]");
  int64_t out0_rows = o.op == RectOp::kGels ? n : m;
  if (o.op == RectOp::kGels) {
    const auto& bd = o.b->dimensions();
    if (o.b->element_type() != o.a->element_type() || bd.size() != 2 || bd[0] != m || bd[1] < 1)
      return Fail(target + ": b must be [M, nrhs] of A's dtype with M=" + std::to_string(m));
    if (o.out0_dims.size() != 2 || o.out0_dims[0] != out0_rows || o.out0_dims[1] != bd[1])
      return Fail(target + ": x must be [N, nrhs]");
  } else if (o.out0_dims.size() != 2 || o.out0_dims[0] != out0_rows || o.out0_dims[1] != k) {
    return Fail(target + ": the first result must be [M, K]");
  }
  Int info = 0;
  Outcome out = Engine::Get().Run(
      CallOrder{o.call_id, o.instance}, MpGrid{std::max(m, n), o.rows, o.cols},
      position, [&](Int context) -> Outcome {
        Int rows = 0, cols = 0, row = -1, col = -1;
        Typed<BlacsGridinfo>("blacs_gridinfo_")(&context, &rows, &cols, &row, &col);
        if (row < 0 || col < 0) return Outcome::Fail("this process is not on the grid");
        switch (*type) {
          case Dtype::kF32: return RectCall<float>(o, context, row, col).Run(&info);
          case Dtype::kF64: return RectCall<double>(o, context, row, col).Run(&info);
          case Dtype::kC64: return RectCall<std::complex<float>>(o, context, row, col).Run(&info);
          case Dtype::kC128:
            return RectCall<std::complex<double>>(o, context, row, col).Run(&info);
        }
        return Outcome::Fail("unknown dtype");
      });
  if (!out.ok) return Fail(target + ": " + out.message);
  if (info < 0)
    return Fail(target + ": ScaLAPACK reported illegal argument " + std::to_string(-info));
  if (info != 0) {
    const size_t element = ElementSize(*type);
    const int64_t nrhs = o.op == RectOp::kGels ? o.b->dimensions()[1] : 0;
    switch (o.op) {
      case RectOp::kGesvd:
        FillNaN(o.out0, static_cast<size_t>(m * k) * element);
        FillNaN(o.out1, static_cast<size_t>(k) * RealElementSize(*type));
        FillNaN(o.out2, static_cast<size_t>(k * n) * element);
        break;
      case RectOp::kQr:
        FillNaN(o.out0, static_cast<size_t>(m * k) * element);
        FillNaN(o.out1, static_cast<size_t>(k * n) * element);
        break;
      case RectOp::kGels: FillNaN(o.out0, static_cast<size_t>(n * nrhs) * element); break;
    }
  }
  o.status[0] = info;
  return ffi::Error::Success();
}

}  // namespace jaxmg
