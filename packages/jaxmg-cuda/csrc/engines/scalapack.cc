// Backend "mp"'s square routines on CPUs (scalapack.h): one function per library step
// (base/routines.h) on this process's local array, run in the order of calls every process
// agreed on (scalapack_engine.h), and what tells whether ScaLAPACK is loaded.
#include "engines/scalapack.h"

#include <algorithm>
#include <complex>
#include <cstring>
#include <string>
#include <vector>

#include "base/common.h"
#include "engines/scalapack_engine.h"

namespace jaxmg {

using namespace scalapack;  // the binding this file shares with scalapack_rect.cc

namespace {

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

}  // namespace jaxmg
