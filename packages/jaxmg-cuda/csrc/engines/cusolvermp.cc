// cuSOLVERMp over NCCL (cusolvermp.h), the square routines: one call on this process's local
// array (the libraries and the process's communicators, handle and grids: cusolvermp_engine.h).
#include "engines/cusolvermp.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "base/common.h"
#include "engines/cusolvermp_engine.h"

namespace jaxmg {
namespace {

using cusolvermp::Connect;
using cusolvermp::Connection;
using cusolvermp::Libraries;
using cusolvermp::ReadPosition;

// --- one call ------------------------------------------------------------------------------------

class Call {
 public:
  Call(const Libraries* libs, const Operands& o, const MpGrid& g, cudaStream_t stream,
       int32_t ordinal, ScratchFn scratch)
      : libs_(libs),
        rt_(libs->rt),
        o_(o),
        g_(g),
        stream_(stream),
        ordinal_(ordinal),
        mem_(libs->rt, stream, ordinal, std::move(scratch)) {}

  ~Call() {
    for (cuda::cusolverMpMatrixDescriptor_t d : {desc_a_, desc_b_, desc_q_})
      if (d != nullptr) libs_->mp.cusolverMpDestroyMatrixDesc(d);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Reads the position, checks the operands, then runs the routine's steps; `info` as
  // LAPACK's (the same on every process).
  Outcome Run(const std::string& nccl_id, Dtype* dtype, int* info) {
    *info = 0;
    JAXMG_CUDART(rt_, cudaSetDevice(ordinal_));
    int32_t position = -1;
    if (Outcome r = ReadPosition(rt_, o_.position, o_.position_count, stream_, &position); !r.ok)
      return r;
    if (std::string error = CheckMpOperands(o_, g_, position, dtype); !error.empty())
      return Outcome::Fail(error);
    if (g_.blocks)
      return Outcome::Fail(
          "cuSOLVERMp has no redistribution: relayout the blocks of P(r, c) in JAX first "
          "(relayout='jax'), or use a 1D or square grid with the default tile");
    dtype_ = *dtype;
    esize_ = ElementSize(dtype_);
    type_ = CudaDataType(dtype_);
    n_ = g_.n;
    tile_ = o_.tile;
    row_ = position / g_.cols;
    col_ = position % g_.cols;
    lld_ = o_.a->dimensions()[1];
    if (Outcome r = Setup(nccl_id, position); !r.ok) return r;

    if (o_.a->untyped_data() != o_.a_out)
      JAXMG_CUDART(rt_, cudaMemcpyAsync(o_.a_out, o_.a->untyped_data(), o_.a->size_bytes(),
                                        cuda::cudaMemcpyDefault, stream_));
    if (o_.routine->rhs && o_.b->untyped_data() != o_.x_out)
      JAXMG_CUDART(rt_, cudaMemcpyAsync(o_.x_out, o_.b->untyped_data(), o_.b->size_bytes(),
                                        cuda::cudaMemcpyDefault, stream_));
    if (o_.routine->rhs) {
      if (Outcome r = PrepareRhs(); !r.ok) return r;
    }
    for (Step step : o_.routine->steps) {
      if (Outcome r = RunStep(step, info); !r.ok) return r;
      if (*info != 0) break;
    }
    if (o_.routine->rhs && *info == 0) return GatherRhs();
    return {};
  }

 private:
  // The communicator, handle, grid and A's descriptor of this call.
  Outcome Setup(const std::string& nccl_id, int32_t position) {
    Connection c;
    if (Outcome r = Connect(libs_, nccl_id, g_.rows, g_.cols, position, ordinal_, stream_, &c);
        !r.ok)
      return r;
    comm_ = c.comm;
    handle_ = c.handle;
    grid_ = c.grid;
    local_rows_ = libs_->mp.cusolverMpNUMROC(n_, tile_, static_cast<uint32_t>(row_), 0,
                                             static_cast<uint32_t>(g_.rows));
    local_cols_ = libs_->mp.cusolverMpNUMROC(n_, tile_, static_cast<uint32_t>(col_), 0,
                                             static_cast<uint32_t>(g_.cols));
    if (lld_ < std::max<int64_t>(1, local_rows_) || o_.a->dimensions()[0] < local_cols_)
      return Outcome::Fail("the local array [" + std::to_string(o_.a->dimensions()[0]) + ", " +
                           std::to_string(lld_) + "] cannot hold the " +
                           std::to_string(local_rows_) + " x " + std::to_string(local_cols_) +
                           " local block");
    if (o_.routine->pivots != Pivots::kNone && o_.ipiv_count < PivotCount())
      return Outcome::Fail("the pivots need " + std::to_string(PivotCount()) + " entries, got " +
                           std::to_string(o_.ipiv_count));
    JAXMG_CUSOLVERMP(libs_, cusolverMpCreateMatrixDesc(&desc_a_, grid_, type_, n_, n_, tile_, tile_,
                                                       0, 0, lld_));
    return {};
  }

  // Global row (column) of local row (column) `l` of process row (column) `p` of `procs`.
  int64_t Global(int64_t l, int64_t p, int64_t procs) const {
    return ((l / tile_) * procs + p) * tile_ + l % tile_;
  }

  // The right-hand sides. cuSOLVERMp 0.9 solves one at a time (NRHS == 1, NVIDIA's samples):
  // B is one column, N x 1 in A's row tiles, held by process column 0. The input b moves to
  // scratch; x, zeroed, receives each solved column from process column 0, and one sum over
  // the communicator gives every process all of x.
  Outcome PrepareRhs() {
    nrhs_ = o_.x_dims[0];
    ldb_ = std::max<int64_t>(1, local_rows_);
    const size_t x_bytes = static_cast<size_t>(nrhs_ * n_) * esize_;
    if (Outcome r = mem_.Allocate(x_bytes, &rhs_); !r.ok) return r;
    JAXMG_CUDART(rt_, cudaMemcpyAsync(rhs_, o_.x_out, x_bytes, cuda::cudaMemcpyDefault, stream_));
    JAXMG_CUDART(rt_, cudaMemsetAsync(o_.x_out, 0, x_bytes, stream_));
    if (Outcome r = mem_.Allocate(static_cast<size_t>(ldb_) * esize_, &b_); !r.ok) return r;
    JAXMG_CUSOLVERMP(
        libs_, cusolverMpCreateMatrixDesc(&desc_b_, grid_, type_, n_, 1, tile_, tile_, 0, 0, ldb_));
    return {};
  }

  // Column j of `x` ([nrhs, N]) to B (`to_b`) or back: this process's rows, one copy per tile.
  Outcome CopyColumn(void* x, int64_t j, bool to_b) {
    if (col_ != 0) return {};  // B's one column lives in process column 0
    char* column = static_cast<char*>(x) + static_cast<size_t>(j * n_) * esize_;
    char* b = static_cast<char*>(b_);
    for (int64_t il = 0; il < local_rows_; il += tile_) {
      const size_t bytes = static_cast<size_t>(std::min(tile_, local_rows_ - il)) * esize_;
      char* in_x = column + static_cast<size_t>(Global(il, row_, g_.rows)) * esize_;
      char* in_b = b + static_cast<size_t>(il) * esize_;
      JAXMG_CUDART(rt_, cudaMemcpyAsync(to_b ? in_b : in_x, to_b ? in_x : in_b, bytes,
                                        cuda::cudaMemcpyDefault, stream_));
    }
    return {};
  }

  // Every right-hand side through `solve` (one library call on B), in order; stops at the
  // first nonzero info.
  template <typename SolveFn>
  Outcome EachRhs(int* info, SolveFn solve) {
    for (int64_t j = 0; j < nrhs_; ++j) {
      if (Outcome r = CopyColumn(rhs_, j, true); !r.ok) return r;
      if (Outcome r = solve(); !r.ok) return r;
      if (Outcome r = mem_.ReadInfo(info); !r.ok) return r;
      if (*info != 0) return {};
      if (Outcome r = CopyColumn(o_.x_out, j, false); !r.ok) return r;
    }
    return {};
  }

  // x on every process: the solved columns process column 0 wrote into zeros, summed.
  Outcome GatherRhs() {
    const size_t bytes = static_cast<size_t>(nrhs_ * n_) * esize_;
    return cusolvermp::SumOverGrid(libs_, o_.x_out, bytes, dtype_, comm_, stream_);
  }

  // One library step; `info` (host) gets the library's.
  Outcome RunStep(Step step, int* info) {
    const auto lower = cuda::CUBLAS_FILL_MODE_LOWER;
    void* a = o_.a_out;
    int* d_info = nullptr;
    if (Outcome r = mem_.Info(&d_info); !r.ok) return r;
    switch (step) {
      case Step::kPotrf: {
        if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
              JAXMG_CUSOLVERMP(libs_, cusolverMpPotrf_bufferSize(handle_, lower, n_, a, 1, 1,
                                                                 desc_a_, type_, d, h));
              return {};
            });
            !r.ok)
          return r;
        const int potrf =
            libs_->mp.cusolverMpPotrf(handle_, lower, n_, a, 1, 1, desc_a_, type_, mem_.device(),
                                      mem_.device_bytes(), mem_.host(), mem_.host_bytes(), d_info);
        if (potrf == cuda::CUSOLVER_STATUS_INTERNAL_ERROR)
          return Outcome::Fail(
              "cusolverMpPotrf failed with CUSOLVER_STATUS_INTERNAL_ERROR, which cuSOLVERMp 0.8.0 "
              "answers for a matrix that is not positive definite (docs/gpu.md) instead of "
              "LAPACK's info: A is not positive definite, or the library failed, and which one "
              "cannot be told here; backend 'mg' returns the order of the failing minor as the "
              "status");
        if (potrf != 0)
          return Outcome::Fail(std::string("cusolverMpPotrf failed: ") + CusolverStatusName(potrf) +
                               " (" + std::to_string(potrf) + ")");
        return mem_.ReadInfo(info);
      }
      case Step::kPotrs: {
        if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
              JAXMG_CUSOLVERMP(
                  libs_, cusolverMpPotrs_bufferSize(handle_, lower, n_, 1, a, 1, 1, desc_a_, b_, 1,
                                                    1, desc_b_, type_, d, h));
              return {};
            });
            !r.ok)
          return r;
        return EachRhs(info, [&]() -> Outcome {
          JAXMG_CUSOLVERMP(
              libs_, cusolverMpPotrs(handle_, lower, n_, 1, a, 1, 1, desc_a_, b_, 1, 1, desc_b_,
                                     type_, mem_.device(), mem_.device_bytes(), mem_.host(),
                                     mem_.host_bytes(), d_info));
          return {};
        });
      }
      case Step::kPotri:
        return Outcome::Fail(
            "cuSOLVERMp has no inverse (potri), and solves one right-hand side at a time: "
            "backend 'mp' on GPUs has no potri");
      case Step::kGetrf: return Getrf(a, d_info, info);
      case Step::kGetrs: return Getrs(a, d_info, info);
      case Step::kSyevd: {
        if (Outcome r = Syevd(a, d_info); !r.ok) return r;
        return mem_.ReadInfo(info);
      }
    }
    return Outcome::Fail("unknown library step");
  }

  // The pivots: cuSOLVERMp's are int64 on the device, one per local column of A (as in
  // NVIDIA's samples); jaxmg's operand stays int32 (a process's pivots are few: converted on
  // the host).
  size_t PivotCount() const { return static_cast<size_t>(std::max<int64_t>(1, local_cols_)); }

  Outcome Getrf(void* a, int* d_info, int* info) {
    void* ipiv = nullptr;
    if (Outcome r = mem_.Allocate(PivotCount() * sizeof(int64_t), &ipiv); !r.ok) return r;
    auto* pivots = static_cast<int64_t*>(ipiv);
    if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
          JAXMG_CUSOLVERMP(libs_, cusolverMpGetrf_bufferSize(handle_, n_, n_, a, 1, 1, desc_a_,
                                                             pivots, type_, d, h));
          return {};
        });
        !r.ok)
      return r;
    JAXMG_CUSOLVERMP(
        libs_, cusolverMpGetrf(handle_, n_, n_, a, 1, 1, desc_a_, pivots, type_, mem_.device(),
                               mem_.device_bytes(), mem_.host(), mem_.host_bytes(), d_info));
    if (Outcome r = mem_.ReadInfo(info); !r.ok) return r;
    if (*info > 0) {
      if (Outcome r = FirstZeroPivot(a, info); !r.ok) return r;
    }
    std::vector<int64_t> wide(PivotCount());
    JAXMG_CUDART(rt_, cudaMemcpyAsync(wide.data(), ipiv, wide.size() * sizeof(int64_t),
                                      cuda::cudaMemcpyDeviceToHost, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    std::vector<int32_t> narrow(o_.ipiv_count, 0);
    for (size_t i = 0; i < wide.size(); ++i) narrow[i] = static_cast<int32_t>(wide[i]);
    JAXMG_CUDART(rt_, cudaMemcpyAsync(o_.ipiv, narrow.data(), narrow.size() * sizeof(int32_t),
                                      cuda::cudaMemcpyHostToDevice, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));  // `narrow` goes out of scope
    return {};
  }

  // LAPACK's info of a singular factor, the first k with U(k, k) exactly zero (1-based), read
  // from U's diagonal: cuSOLVERMp's Getrf says that U is singular but not where (docs/gpu.md).
  // Each process puts the first zero of its diagonal entries (or N + 1) at its position of a
  // vector; one sum over the communicator gives every process all of them.
  Outcome FirstZeroPivot(const void* a, int* info) {
    std::vector<char> local(o_.a->size_bytes());
    JAXMG_CUDART(
        rt_, cudaMemcpyAsync(local.data(), a, local.size(), cuda::cudaMemcpyDeviceToHost, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    const size_t parts = esize_ / RealElementSize(dtype_);  // 2 for complex
    const bool single = RealElementSize(dtype_) == sizeof(float);
    auto is_zero = [&](const char* p) {
      for (size_t k = 0; k < parts; ++k) {
        const double v =
            single ? reinterpret_cast<const float*>(p)[k] : reinterpret_cast<const double*>(p)[k];
        if (v != 0) return false;
      }
      return true;
    };
    int64_t first = n_ + 1;
    for (int64_t j = 0; j < local_cols_ && first > n_; ++j) {
      const int64_t gj = Global(j, col_, g_.cols);
      for (int64_t i = 0; i < local_rows_; ++i)
        if (Global(i, row_, g_.rows) == gj) {
          if (is_zero(local.data() + static_cast<size_t>(i + j * lld_) * esize_)) first = gj + 1;
          break;
        }
    }
    const int64_t processes = g_.rows * g_.cols;
    std::vector<double> firsts(static_cast<size_t>(processes), 0.0);
    firsts[static_cast<size_t>(row_ * g_.cols + col_)] = static_cast<double>(first);
    void* d_firsts = nullptr;
    const size_t bytes = firsts.size() * sizeof(double);
    if (Outcome r = mem_.Allocate(bytes, &d_firsts); !r.ok) return r;
    JAXMG_CUDART(rt_, cudaMemcpyAsync(d_firsts, firsts.data(), bytes, cuda::cudaMemcpyHostToDevice,
                                      stream_));
    if (Outcome r = cusolvermp::SumOverGrid(libs_, d_firsts, bytes, Dtype::kF64, comm_, stream_);
        !r.ok)
      return r;
    JAXMG_CUDART(rt_, cudaMemcpyAsync(firsts.data(), d_firsts, bytes, cuda::cudaMemcpyDeviceToHost,
                                      stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    const double lowest = *std::min_element(firsts.begin(), firsts.end());
    if (lowest <= static_cast<double>(n_)) *info = static_cast<int>(lowest);
    return {};
  }

  Outcome Getrs(void* a, int* d_info, int* info) {
    if (o_.trans != 'N')
      return Outcome::Fail(std::string("cuSOLVERMp solves only with A itself (trans 'N', "
                                       "NVIDIA's samples), not with op(A) = A^T or A^H: got '") +
                           o_.trans + "'");
    std::vector<int32_t> narrow(PivotCount());
    JAXMG_CUDART(rt_, cudaMemcpyAsync(narrow.data(), o_.ipiv, narrow.size() * sizeof(int32_t),
                                      cuda::cudaMemcpyDeviceToHost, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
    const std::vector<int64_t> wide(narrow.begin(), narrow.end());
    void* ipiv = nullptr;
    if (Outcome r = mem_.Allocate(wide.size() * sizeof(int64_t), &ipiv); !r.ok) return r;
    JAXMG_CUDART(rt_, cudaMemcpyAsync(ipiv, wide.data(), wide.size() * sizeof(int64_t),
                                      cuda::cudaMemcpyHostToDevice, stream_));
    JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));  // `wide` goes out of scope
    const auto* pivots = static_cast<const int64_t*>(ipiv);
    const auto op = cuda::CUBLAS_OP_N;
    if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
          JAXMG_CUSOLVERMP(
              libs_, cusolverMpGetrs_bufferSize(handle_, op, n_, 1, a, 1, 1, desc_a_, pivots, b_, 1,
                                                1, desc_b_, type_, d, h));
          return {};
        });
        !r.ok)
      return r;
    return EachRhs(info, [&]() -> Outcome {
      JAXMG_CUSOLVERMP(libs_, cusolverMpGetrs(handle_, op, n_, 1, a, 1, 1, desc_a_, pivots, b_, 1,
                                              1, desc_b_, type_, mem_.device(), mem_.device_bytes(),
                                              mem_.host(), mem_.host_bytes(), d_info));
      return {};
    });
  }

  // Eigenvalues into w (every process) and vectors into a separate array of A's shape, then
  // over A (the vectors always: the CPU engine computes them too, and the results agree).
  Outcome Syevd(void* a, int* d_info) {
    const size_t bytes = o_.a->size_bytes();
    void* q = nullptr;
    if (Outcome r = mem_.Allocate(bytes, &q); !r.ok) return r;
    JAXMG_CUSOLVERMP(libs_, cusolverMpCreateMatrixDesc(&desc_q_, grid_, type_, n_, n_, tile_, tile_,
                                                       0, 0, lld_));
    char jobz[] = "V";  // cuSOLVERMp takes a writable char*
    const auto lower = cuda::CUBLAS_FILL_MODE_LOWER;
    if (Outcome r = mem_.Workspaces([&](size_t* d, size_t* h) -> Outcome {
          JAXMG_CUSOLVERMP(libs_,
                           cusolverMpSyevd_bufferSize(handle_, jobz, lower, n_, a, 1, 1, desc_a_,
                                                      o_.w_out, q, 1, 1, desc_q_, type_, d, h));
          return {};
        });
        !r.ok)
      return r;
    JAXMG_CUSOLVERMP(
        libs_, cusolverMpSyevd(handle_, jobz, lower, n_, a, 1, 1, desc_a_, o_.w_out, q, 1, 1,
                               desc_q_, type_, mem_.device(), mem_.device_bytes(), mem_.host(),
                               mem_.host_bytes(), d_info));
    JAXMG_CUDART(rt_, cudaMemcpyAsync(a, q, bytes, cuda::cudaMemcpyDefault, stream_));
    return {};
  }

  const Libraries* libs_;
  const Api* rt_;
  const Operands& o_;
  const MpGrid& g_;
  cudaStream_t stream_;
  int32_t ordinal_;
  cusolvermp::CallMemory mem_;  // B, pivots, eigenvectors, info and workspaces
  Dtype dtype_ = Dtype::kF64;
  size_t esize_ = 8;
  cuda::cudaDataType type_ = cuda::CUDA_R_64F;
  int64_t n_ = 0, tile_ = 0, row_ = 0, col_ = 0, lld_ = 0, local_rows_ = 0, local_cols_ = 0;
  int64_t nrhs_ = 0, ldb_ = 1;
  cuda::ncclComm_t comm_ = nullptr;
  cuda::cusolverMpHandle_t handle_ = nullptr;
  cuda::cusolverMpGrid_t grid_ = nullptr;
  cuda::cusolverMpMatrixDescriptor_t desc_a_ = nullptr, desc_b_ = nullptr, desc_q_ = nullptr;
  void* rhs_ = nullptr;  // the input b, [nrhs, N] (device, scratch)
  void* b_ = nullptr;    // this process's part of B, one column (device, scratch)
};

}  // namespace

ffi::Error RunOnCusolverMp(const Operands& o, const MpGrid& g, ffi::Span<const int64_t> nccl_id,
                           cudaStream_t stream, int32_t ordinal, ScratchFn scratch) {
  const Libraries* libs = nullptr;
  std::string id;
  if (Outcome r = cusolvermp::Begin(nccl_id, &libs, &id); !r.ok)
    return Fail(std::string(o.target) + ": " + r.message);
  std::lock_guard<std::mutex> lock(cusolvermp::StateMutex());
  Dtype dtype = Dtype::kF64;
  int info = 0;
  Call call(libs, o, g, stream, ordinal, std::move(scratch));
  Outcome out = call.Run(id, &dtype, &info);
  if (out.ok) {
    std::vector<std::pair<void*, size_t>> outputs;  // NaN where the call fails
    if (o.routine->rhs) outputs.push_back({o.x_out, o.b->size_bytes()});
    if (o.routine->result != Result::kUnchanged) outputs.push_back({o.a_out, o.a->size_bytes()});
    if (o.routine->eigenvalues)
      outputs.push_back({o.w_out, static_cast<size_t>(g.n) * RealElementSize(dtype)});
    out = cusolvermp::Finish(libs, info, outputs, o.status_out, stream);
  }
  if (!out.ok) return Fail(std::string(o.target) + ": " + out.message);
  return ffi::Error::Success();
}

}  // namespace jaxmg
