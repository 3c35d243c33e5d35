// Backend "mp"'s rectangular routines on CPUs (RectOp, scalapack.h), which only ScaLAPACK runs:
// p?gesvd, p?geqrf with p?orgqr / p?ungqr, and p?gels, on A redistributed from JAX's blocks into
// tiles, run in the order of calls every process agreed on (scalapack_engine.h); the results
// whole on every process, or (`blocks`) redistributed back into JAX's blocks.
#include "engines/scalapack.h"

#include <algorithm>
#include <complex>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/common.h"
#include "engines/scalapack_engine.h"

namespace jaxmg {

using namespace scalapack;  // the binding this file shares with scalapack.cc

namespace {

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

// The dimensions a result of r x c must have: [r, c] whole, [c/cols, r/rows] as a block.
std::vector<int64_t> ResultDims(const RectOperands& o, int64_t r, int64_t c) {
  if (o.InBlocks(r, c)) return {c / o.cols, r / o.rows};
  return {r, c};
}

bool HasDims(const ffi::AnyBuffer::Dimensions& dims, const std::vector<int64_t>& want) {
  return std::equal(dims.begin(), dims.end(), want.begin(), want.end());
}

std::string Shown(const std::vector<int64_t>& dims) {
  return "[" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "]";
}

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
    Int block_desc[9], one = 1;
    if (!DescribeBlocks(m, n, block_desc)) return Outcome::Fail("descinit rejected A's blocks");
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
  using Gemr2d = void (*)(const Int*, const Int*, const void*, const Int*, const Int*,
                          const Int*, void*, const Int*, const Int*, const Int*, const Int*);

  Tiles Shape(Int m, Int n) const {
    return Tiles{m, n, static_cast<Int>(o_.tile), rows(), cols(), row_, col_};
  }
  void Describe(const Tiles& t, Int* desc) {
    Int zero = 0, info = 0, lld = t.Lld();
    Typed<Descinit>("descinit_")(desc, &t.m, &t.n, &t.tile, &t.tile, &zero, &zero, &context_,
                                 &lld, &info);
  }

  // An m x n matrix in JAX's blocks [m/rows, n/cols]: a 2D block-cyclic layout of one tile each.
  bool DescribeBlocks(Int m, Int n, Int* desc) {
    Int zero = 0, info = 0, block_rows = m / rows(), block_cols = n / cols();
    Int lld = std::max<Int>(1, block_rows);
    Typed<Descinit>("descinit_")(desc, &m, &n, &block_rows, &block_cols, &zero, &zero, &context_,
                                 &lld, &info);
    return info == 0;
  }

  // The leading `out_rows x out_cols` of a distributed matrix into `out`: with `blocks`, where
  // the grid divides it, this process's block of JAX's sharding (p?gemr2d from the tiles, then
  // the entries `keep` rejects zeroed), else whole on every process (Gather).
  template <typename Keep>
  void Deliver(const Tiles& t, const Int* desc, const T* local, Int out_rows, Int out_cols,
               T* out, Keep keep) {
    if (!o_.InBlocks(out_rows, out_cols)) return Gather(t, local, out_rows, out_cols, out, keep);
    Int block_desc[9], one = 1;
    DescribeBlocks(out_rows, out_cols, block_desc);  // accepted as A's were: same grid
    Typed<Gemr2d>(Name<T>("gemr2d"))(&out_rows, &out_cols, local, &one, &one, desc, out, &one,
                                     &one, block_desc, &context_);
    const Int block_rows = out_rows / rows(), block_cols = out_cols / cols();
    for (Int j = 0; j < block_cols; ++j)
      for (Int i = 0; i < block_rows; ++i)
        if (!keep(row_ * block_rows + i, col_ * block_cols + j))
          out[i + static_cast<size_t>(j) * block_rows] = T(0);
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
    Deliver(ut, desc_u, u.data(), m, k, static_cast<T*>(o_.out0), all);
    std::memcpy(o_.out1, s.data(), s.size() * sizeof(Real));  // every process has s
    Deliver(vt, desc_vt, v.data(), k, n, static_cast<T*>(o_.out2), all);
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
    Deliver(at, desc_a_, a_.data(), k, n, static_cast<T*>(o_.out1),
            [](Int i, Int j) { return i <= j; });
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
    Deliver(at, desc_a_, a_.data(), m, k, static_cast<T*>(o_.out0), [](Int, Int) { return true; });
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

}  // namespace

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
  const std::string block =
      o.blocks ? " (with blocks: [C/cols, R/rows] where the grid divides R x C)" : "";
  if (o.op == RectOp::kGels) {
    const auto& bd = o.b->dimensions();
    if (o.b->element_type() != o.a->element_type() || bd.size() != 2 || bd[0] != m || bd[1] < 1)
      return Fail(target + ": b must be [M, nrhs] of A's dtype with M=" + std::to_string(m));
    if (!HasDims(o.out0_dims, {n, bd[1]})) return Fail(target + ": x must be [N, nrhs]");
  } else {
    const std::vector<int64_t> first = ResultDims(o, m, k);
    if (!HasDims(o.out0_dims, first))
      return Fail(target + ": the first result must be " + Shown(first) + ", M x K" + block);
    const std::vector<int64_t> last = ResultDims(o, k, n);
    const auto& dims = o.op == RectOp::kQr ? o.out1_dims : o.out2_dims;
    if (!HasDims(dims, last))
      return Fail(target + ": " + (o.op == RectOp::kQr ? "R" : "VT") + " must be " +
                  Shown(last) + ", K x N" + block);
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
    auto count = [](const ffi::AnyBuffer::Dimensions& dims) {
      return static_cast<size_t>(dims[0] * dims[1]);
    };
    switch (o.op) {
      case RectOp::kGesvd:
        FillNaN(o.out0, count(o.out0_dims) * element);
        FillNaN(o.out1, static_cast<size_t>(k) * RealElementSize(*type));
        FillNaN(o.out2, count(o.out2_dims) * element);
        break;
      case RectOp::kQr:
        FillNaN(o.out0, count(o.out0_dims) * element);
        FillNaN(o.out1, count(o.out1_dims) * element);
        break;
      case RectOp::kGels: FillNaN(o.out0, static_cast<size_t>(n * nrhs) * element); break;
    }
  }
  o.status[0] = info;
  return ffi::Error::Success();
}

}  // namespace jaxmg
