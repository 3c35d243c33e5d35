// cuSOLVERMp over NCCL (cusolvermp.h), the rectangular routines of backend "mp" on GPUs: qr
// (Geqrf, then Orgqr) and gels (Gels), on A's local array in tile-square tiles (the caller
// relayouts JAX's blocks in JAX first: cuSOLVERMp has no p?gemr2d), the results whole on every
// process, as scalapack_rect.cc's, or qr's with `blocks` as local arrays in the same tiles (JAX
// relayouts them back). gesvd is not here: cusolverMpGesvd came in 0.9.0, and where
// it is missing or not yet bound jaxmg's compositions run on GPUs (jaxmg._svd).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "base/common.h"
#include "engines/cusolvermp.h"
#include "engines/cusolvermp_engine.h"

namespace jaxmg {
namespace {

using cusolvermp::Connection;
using cusolvermp::Libraries;

// A block's extent `block` rounded up to whole tiles (BlockCyclic2D.padded_local_shape).
int64_t Padded(int64_t block, int64_t tile) { return (block + tile - 1) / tile * tile; }

class RectCall {
 public:
  RectCall(const Libraries* libs, const RectOperands& o, cudaStream_t stream, int32_t ordinal,
           ScratchFn scratch)
      : libs_(libs),
        rt_(libs->rt),
        o_(o),
        stream_(stream),
        ordinal_(ordinal),
        mem_(libs->rt, stream, ordinal, std::move(scratch)) {}
  ~RectCall() {
    for (cuda::cusolverMpMatrixDescriptor_t d : {desc_a_, desc_b_})
      if (d != nullptr) libs_->mp.cusolverMpDestroyMatrixDesc(d);
  }
  RectCall(const RectCall&) = delete;
  RectCall& operator=(const RectCall&) = delete;

  // Checks the operands, then runs the routine; `info` as LAPACK's (the same on every process).
  Outcome Run(const std::string& nccl_id, int* info) {
    *info = 0;
    JAXMG_CUDART(rt_, cudaSetDevice(ordinal_));
    int32_t position = -1;
    if (Outcome r =
            cusolvermp::ReadPosition(rt_, o_.position, o_.position_count, stream_, &position);
        !r.ok)
      return r;
    if (Outcome r = Check(position); !r.ok) return r;
    Connection c;
    if (Outcome r =
            cusolvermp::Connect(libs_, nccl_id, o_.rows, o_.cols, position, ordinal_, stream_, &c);
        !r.ok)
      return r;
    comm_ = c.comm;
    handle_ = c.handle;
    JAXMG_CUSOLVERMP(libs_, cusolverMpCreateMatrixDesc(&desc_a_, c.grid, type_, o_.m, o_.n, o_.tile,
                                                       o_.tile, 0, 0, lld_));
    grid_ = c.grid;
    if (Outcome r = mem_.Allocate(o_.a->size_bytes(), &work_); !r.ok) return r;
    switch (o_.op) {
      case RectOp::kQr: return Qr(info);
      case RectOp::kGels: return Gels(info);
      case RectOp::kGesvd: break;
    }
    return Outcome::Fail(
        "cuSOLVERMp's gesvd is not bound by jaxmg: jaxmg's compositions run "
        "svd, polar and lstsq on GPUs");
  }

  // Every output's bytes (for the NaN of a failed call).
  std::vector<std::pair<void*, size_t>> Outputs() const {
    const int64_t k = std::min(o_.m, o_.n);
    if (o_.op == RectOp::kQr)
      return {{o_.out0, Count(CusolverMpResultDims(o_, o_.m, k)) * esize_},
              {o_.out1, Count(CusolverMpResultDims(o_, k, o_.n)) * esize_}};
    return {{o_.out0, static_cast<size_t>(o_.n * nrhs_) * esize_}};
  }

 private:
  Outcome Check(int32_t position) {
    const std::optional<Dtype> dtype = DtypeOf(o_.a->element_type());
    if (!dtype.has_value())
      return Outcome::Fail("A must be float32, float64, complex64 or complex128");
    dtype_ = *dtype;
    esize_ = ElementSize(dtype_);
    type_ = CudaDataType(dtype_);
    if (o_.rows < 1 || o_.cols < 1) return Outcome::Fail("grid must be (rows, cols), both >= 1");
    if (position < 0 || position >= o_.rows * o_.cols)
      return Outcome::Fail("position " + std::to_string(position) + " is not on the " +
                           std::to_string(o_.rows) + " x " + std::to_string(o_.cols) + " grid");
    if (o_.m < 1 || o_.n < 1 || o_.tile < 1) return Outcome::Fail("M, N and T_A must be positive");
    row_ = position / o_.cols;
    col_ = position % o_.cols;
    local_rows_ = libs_->mp.cusolverMpNUMROC(o_.m, o_.tile, static_cast<uint32_t>(row_), 0,
                                             static_cast<uint32_t>(o_.rows));
    local_cols_ = libs_->mp.cusolverMpNUMROC(o_.n, o_.tile, static_cast<uint32_t>(col_), 0,
                                             static_cast<uint32_t>(o_.cols));
    const auto dims = o_.a->dimensions();
    lld_ = dims.size() == 2 ? dims[1] : 0;
    if (dims.size() != 2 || lld_ < std::max<int64_t>(1, local_rows_) || dims[0] < local_cols_)
      return Outcome::Fail("the local array must be [columns, LLD] holding this process's " +
                           std::to_string(local_rows_) + " x " + std::to_string(local_cols_) +
                           " local block of the M x N matrix in T_A-square tiles");
    if (o_.op == RectOp::kQr) return CheckQrResults();
    if (o_.op == RectOp::kGels) {
      const auto b = o_.b != nullptr ? o_.b->dimensions() : ffi::AnyBuffer::Dimensions();
      if (o_.b == nullptr || b.size() != 2 || b[0] != o_.m || b[1] < 1 ||
          o_.b->element_type() != o_.a->element_type())
        return Outcome::Fail("b must be [M, nrhs] of A's dtype");
      if (o_.m < o_.n)
        return Outcome::Fail("gels runs on cuSOLVERMp for M >= N only (least squares); got M=" +
                             std::to_string(o_.m) + " < N=" + std::to_string(o_.n));
      nrhs_ = b[1];
    }
    return {};
  }

  // Q [M, K] and R [K, N] whole, or with `blocks` as local arrays of tiles that JAX's relayout
  // takes back to its blocks: there a tile no wider than the block of every sharded axis.
  Outcome CheckQrResults() const {
    const int64_t m = o_.m, n = o_.n, k = std::min(m, n);
    const struct {
      const char* name;
      int64_t r, c;
      const ffi::AnyBuffer::Dimensions& dims;
    } results[] = {{"Q", m, k, o_.out0_dims}, {"R", k, n, o_.out1_dims}};
    for (const auto& x : results) {
      const std::vector<int64_t> want = CusolverMpResultDims(o_, x.r, x.c);
      if (x.dims.size() != want.size() || !std::equal(want.begin(), want.end(), x.dims.begin()))
        return Outcome::Fail(std::string(x.name) + " must be [" + std::to_string(want[0]) + ", " +
                             std::to_string(want[1]) + "]" +
                             (o_.blocks ? " (with blocks: [Lc, Lr], the local array of tiles "
                                          "transposed, where the grid divides it)"
                                        : ""));
      if (o_.InBlocks(x.r, x.c) && ((o_.rows > 1 && o_.tile > x.r / o_.rows) ||
                                    (o_.cols > 1 && o_.tile > x.c / o_.cols)))
        return Outcome::Fail("with blocks, T_A=" + std::to_string(o_.tile) + " must be at most " +
                             x.name + "'s block on each sharded axis (" +
                             std::to_string(x.r / o_.rows) + " x " +
                             std::to_string(x.c / o_.cols) + ")");
    }
    return {};
  }

  static size_t Count(const std::vector<int64_t>& dims) {
    return static_cast<size_t>(dims[0]) * static_cast<size_t>(dims[1]);
  }

  // Global row (column) of local row (column) `l` of process row (column) `p` of `procs`.
  int64_t Global(int64_t l, int64_t p, int64_t procs) const {
    return ((l / o_.tile) * procs + p) * o_.tile + l % o_.tile;
  }

  // A's local array (the work copy) on the host.
  Outcome LocalToHost(std::vector<char>* out) {
    out->resize(o_.a->size_bytes());
    JAXMG_CUDART(rt_, cudaMemcpyAsync(out->data(), work_, out->size(), cuda::cudaMemcpyDeviceToHost,
                                      stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    return {};
  }

  // `host` (row-major, `bytes`) to the output `out` on every process: each process's entries in
  // zeros elsewhere, summed over the communicator.
  Outcome Whole(const std::vector<char>& host, void* out) {
    JAXMG_CUDART(
        rt_, cudaMemcpyAsync(out, host.data(), host.size(), cuda::cudaMemcpyHostToDevice, stream_));
    if (Outcome r = cusolvermp::SumOverGrid(libs_, out, host.size(), dtype_, comm_, stream_); !r.ok)
      return r;
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));  // `host` goes out of scope
    return {};
  }

  // `host` to the output `out` of this process alone.
  Outcome Place(const std::vector<char>& host, void* out) {
    JAXMG_CUDART(
        rt_, cudaMemcpyAsync(out, host.data(), host.size(), cuda::cudaMemcpyHostToDevice, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));  // `host` goes out of scope
    return {};
  }

  // The leading rows x cols of the local matrix, as it comes back (CusolverMpResultDims): this
  // process's entries where `keep(global row, global column)`, zeros elsewhere; whole (in
  // zeros, summed over the grid) or this process's local array of tiles.
  template <typename Keep>
  Outcome Result(const std::vector<char>& local, int64_t rows, int64_t cols, Keep keep,
                 void* out) {
    if (!o_.InBlocks(rows, cols)) return Whole(Entries(local, rows, cols, keep), out);
    const std::vector<int64_t> dims = CusolverMpResultDims(o_, rows, cols);
    const int64_t lr = dims[1];
    std::vector<char> host(Count(dims) * esize_, 0);
    for (int64_t j = 0; j < std::min(local_cols_, dims[0]); ++j) {
      const int64_t gj = Global(j, col_, o_.cols);
      for (int64_t i = 0; i < std::min(local_rows_, lr); ++i) {
        const int64_t gi = Global(i, row_, o_.rows);
        if (gi < rows && gj < cols && keep(gi, gj))
          std::memcpy(host.data() + static_cast<size_t>(i + j * lr) * esize_,
                      local.data() + static_cast<size_t>(i + j * lld_) * esize_, esize_);
      }
    }
    return Place(host, out);
  }

  // This process's entries of the leading rows x cols of the local matrix, row-major, where
  // `keep(global row, global column)`; zeros elsewhere.
  template <typename Keep>
  std::vector<char> Entries(const std::vector<char>& local, int64_t rows, int64_t cols,
                            Keep keep) const {
    std::vector<char> out(static_cast<size_t>(rows * cols) * esize_, 0);
    for (int64_t j = 0; j < local_cols_; ++j) {
      const int64_t gj = Global(j, col_, o_.cols);
      if (gj >= cols) continue;
      for (int64_t i = 0; i < local_rows_; ++i) {
        const int64_t gi = Global(i, row_, o_.rows);
        if (gi < rows && keep(gi, gj))
          std::memcpy(out.data() + static_cast<size_t>(gi * cols + gj) * esize_,
                      local.data() + static_cast<size_t>(i + j * lld_) * esize_, esize_);
      }
    }
    return out;
  }

  // Q R = A: Geqrf leaves R in A's upper trapezoid and the reflectors below it, Orgqr makes the
  // first K columns of Q from them. LAPACK's signs (R's diagonal may be negative).
  Outcome Qr(int* info) {
    const int64_t m = o_.m, n = o_.n, k = std::min(m, n);
    JAXMG_CUDART(rt_, cudaMemcpyAsync(work_, o_.a->untyped_data(), o_.a->size_bytes(),
                                      cuda::cudaMemcpyDefault, stream_));
    const int64_t taus = libs_->mp.cusolverMpNUMROC(k, o_.tile, static_cast<uint32_t>(col_), 0,
                                                    static_cast<uint32_t>(o_.cols));
    void* tau = nullptr;
    if (Outcome r = mem_.Allocate(static_cast<size_t>(taus) * esize_, &tau); !r.ok) return r;
    int* d_info = nullptr;
    if (Outcome r = mem_.Info(&d_info); !r.ok) return r;
    if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
          JAXMG_CUSOLVERMP(
              libs_, cusolverMpGeqrf_bufferSize(handle_, m, n, work_, 1, 1, desc_a_, type_, d, h));
          return {};
        });
        !r.ok)
      return r;
    JAXMG_CUSOLVERMP(libs_,
                     cusolverMpGeqrf(handle_, m, n, work_, 1, 1, desc_a_, tau, type_, mem_.device(),
                                     mem_.device_bytes(), mem_.host(), mem_.host_bytes(), d_info));
    if (Outcome r = mem_.ReadInfo(info); !r.ok || *info != 0) return r;
    std::vector<char> factored;  // R in its upper trapezoid
    if (Outcome r = LocalToHost(&factored); !r.ok) return r;
    if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
          JAXMG_CUSOLVERMP(libs_, cusolverMpOrgqr_bufferSize(handle_, m, k, k, work_, 1, 1, desc_a_,
                                                             tau, type_, d, h));
          return {};
        });
        !r.ok)
      return r;
    JAXMG_CUSOLVERMP(
        libs_, cusolverMpOrgqr(handle_, m, k, k, work_, 1, 1, desc_a_, tau, type_, mem_.device(),
                               mem_.device_bytes(), mem_.host(), mem_.host_bytes(), d_info));
    if (Outcome r = mem_.ReadInfo(info); !r.ok || *info != 0) return r;
    std::vector<char> local;
    if (Outcome r = LocalToHost(&local); !r.ok) return r;
    if (Outcome r = Result(local, m, k, [](int64_t, int64_t) { return true; }, o_.out0); !r.ok)
      return r;
    return Result(factored, k, n, [](int64_t i, int64_t j) { return i <= j; }, o_.out1);
  }

  // The least-squares solution of A x = b (M >= N, A of full rank), one right-hand side at a
  // time (NVIDIA's samples of Potrs and Getrs take NRHS == 1; Gels is used alike), each on a
  // fresh copy of A (Gels overwrites it with its factors). B is M x 1 in A's row tiles, held
  // by process column 0; its first N rows are the solution.
  Outcome Gels(int* info) {
    const int64_t m = o_.m, n = o_.n;
    std::vector<char> b(o_.b->size_bytes());
    JAXMG_CUDART(rt_, cudaMemcpyAsync(b.data(), o_.b->untyped_data(), b.size(),
                                      cuda::cudaMemcpyDeviceToHost, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    const int64_t ldb = std::max<int64_t>(1, local_rows_);
    void* b_local = nullptr;
    if (Outcome r = mem_.Allocate(static_cast<size_t>(ldb) * esize_, &b_local); !r.ok) return r;
    JAXMG_CUSOLVERMP(libs_, cusolverMpCreateMatrixDesc(&desc_b_, grid_, type_, m, 1, o_.tile,
                                                       o_.tile, 0, 0, ldb));
    int* d_info = nullptr;
    if (Outcome r = mem_.Info(&d_info); !r.ok) return r;
    const auto op = cuda::CUBLAS_OP_N;
    std::vector<char> x(static_cast<size_t>(n * nrhs_) * esize_, 0), column(ldb * esize_, 0);
    for (int64_t j = 0; j < nrhs_; ++j) {
      JAXMG_CUDART(rt_, cudaMemcpyAsync(work_, o_.a->untyped_data(), o_.a->size_bytes(),
                                        cuda::cudaMemcpyDefault, stream_));
      if (col_ == 0)
        for (int64_t i = 0; i < local_rows_; ++i)
          std::memcpy(column.data() + i * esize_,
                      b.data() + static_cast<size_t>(Global(i, row_, o_.rows) * nrhs_ + j) * esize_,
                      esize_);
      JAXMG_CUDART(rt_, cudaMemcpyAsync(b_local, column.data(), column.size(),
                                        cuda::cudaMemcpyHostToDevice, stream_));
      if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
            JAXMG_CUSOLVERMP(libs_,
                             cusolverMpGels_bufferSize(handle_, op, m, n, 1, work_, 1, 1, desc_a_,
                                                       b_local, 1, 1, desc_b_, type_, d, h));
            return {};
          });
          !r.ok)
        return r;
      JAXMG_CUSOLVERMP(libs_, cusolverMpGels(handle_, op, m, n, 1, work_, 1, 1, desc_a_, b_local, 1,
                                             1, desc_b_, type_, mem_.device(), mem_.device_bytes(),
                                             mem_.host(), mem_.host_bytes(), d_info));
      if (Outcome r = mem_.ReadInfo(info); !r.ok || *info != 0) return r;
      JAXMG_CUDART(rt_, cudaMemcpyAsync(column.data(), b_local, column.size(),
                                        cuda::cudaMemcpyDeviceToHost, stream_));
      JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
      if (col_ == 0)
        for (int64_t i = 0; i < local_rows_; ++i)
          if (const int64_t gi = Global(i, row_, o_.rows); gi < n)
            std::memcpy(x.data() + static_cast<size_t>(gi * nrhs_ + j) * esize_,
                        column.data() + i * esize_, esize_);
    }
    return Whole(x, o_.out0);
  }

  const Libraries* libs_;
  const Api* rt_;
  const RectOperands& o_;
  cudaStream_t stream_;
  int32_t ordinal_;
  cusolvermp::CallMemory mem_;  // A's copy, tau, B, info and workspaces
  Dtype dtype_ = Dtype::kF64;
  size_t esize_ = 8;
  cuda::cudaDataType type_ = cuda::CUDA_R_64F;
  int64_t row_ = 0, col_ = 0, lld_ = 1, local_rows_ = 0, local_cols_ = 0, nrhs_ = 1;
  cuda::ncclComm_t comm_ = nullptr;
  cuda::cusolverMpHandle_t handle_ = nullptr;
  cuda::cusolverMpGrid_t grid_ = nullptr;
  cuda::cusolverMpMatrixDescriptor_t desc_a_ = nullptr, desc_b_ = nullptr;
  void* work_ = nullptr;  // A's local array, overwritten by the routine (device, scratch)
};

}  // namespace

std::vector<int64_t> CusolverMpResultDims(const RectOperands& o, int64_t r, int64_t c) {
  if (!o.InBlocks(r, c)) return {r, c};
  return {Padded(c / o.cols, o.tile), Padded(r / o.rows, o.tile)};
}

ffi::Error RunRectOnCusolverMp(const RectOperands& o, ffi::Span<const int64_t> nccl_id,
                               cudaStream_t stream, int32_t ordinal, ScratchFn scratch) {
  const Libraries* libs = nullptr;
  std::string id;
  if (Outcome r = cusolvermp::Begin(nccl_id, &libs, &id); !r.ok)
    return Fail(std::string(o.target) + ": " + r.message);
  std::lock_guard<std::mutex> lock(cusolvermp::StateMutex());
  int info = 0;
  RectCall call(libs, o, stream, ordinal, std::move(scratch));
  Outcome out = call.Run(id, &info);
  if (out.ok) out = cusolvermp::Finish(libs, info, call.Outputs(), o.status, stream);
  if (!out.ok) return Fail(std::string(o.target) + ": " + out.message);
  return ffi::Error::Success();
}

}  // namespace jaxmg
