// The native entry of every routine (its row of the table: base/routines.cc): its operands and
// its FFI handlers, bound from one description: the CPU twin and cuSolverMg (backend "mg", the
// target jaxmg_<name>), and ScaLAPACK over MPI on CPUs and cuSOLVERMp over NCCL on CUDA
// (backend "mp", jaxmg_mp_<name>, engines/scalapack.h and engines/cusolvermp.h).
#include "ffi/handlers.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <xla/ffi/api/ffi.h>

#include "base/operands.h"
#include "base/routines.h"
#ifdef JAXMG_WITH_CUDA
#include "engines/cusolvermp.h"
#endif
#include "engines/scalapack.h"
#include "ffi/instance.h"
#ifdef JAXMG_WITH_CUDA
#include "platforms/cuda_targets.h"
#endif
#include "platforms/platforms.h"

namespace jaxmg {
namespace {

using Span = ffi::Span<const int64_t>;
using Status = ffi::Result<ffi::Buffer<ffi::S32>>;
using Position = ffi::Buffer<ffi::S32>;
using Int32s = ffi::Buffer<ffi::S32>;

// The attributes every target takes last, in this order (base/operands.h, Operands).
struct Attrs {
  int64_t tile;
  Span device_ids;
  int64_t call_id;
  int64_t job;
  Span pids;
  Span to_cyclic;
  Span from_cyclic;
};

Operands Finish(Operands o, const Attrs& at, const Instance& instance,
                std::optional<int64_t> run_id) {
  o.instance = instance.Index();
  o.job = at.job;
  o.pids = at.pids;
  o.to_cyclic = at.to_cyclic;
  o.from_cyclic = at.from_cyclic;
  o.run_id = run_id;
  return o;
}

Operands Common(Op op, ffi::AnyBuffer& a, void* a_out, Position& position, Status& status,
                const Attrs& at) {
  return CommonOperands(op, a, a_out, position, status, at.tile, at.device_ids, at.call_id);
}

void WithRhs(Operands* o, ffi::AnyBuffer& b, ffi::Result<ffi::AnyBuffer>& x) {
  o->b = &b;
  o->x_out = x->untyped_data();
  o->x_dims = x->dimensions();
}

// --- each routine's operands, in the order its handlers bind them ---------------------------

Operands Potrs(const Attrs& at, ffi::AnyBuffer& a, ffi::AnyBuffer& b, Position& position,
               ffi::Result<ffi::AnyBuffer>& factor, ffi::Result<ffi::AnyBuffer>& x,
               Status& status) {
  Operands o = Common(Op::kPotrs, a, factor->untyped_data(), position, status, at);
  WithRhs(&o, b, x);
  return o;
}
template <typename B>
auto PotrsBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // a [L, N]
      .template Arg<ffi::AnyBuffer>()          // b [nrhs, N]
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // factor, aliases a
      .template Ret<ffi::AnyBuffer>()          // x, aliases b
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands Potri(const Attrs& at, ffi::AnyBuffer& a, Position& position,
               ffi::Result<ffi::AnyBuffer>& inverse, Status& status) {
  return Common(Op::kPotri, a, inverse->untyped_data(), position, status, at);
}
template <typename B>
auto PotriBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // a [L, N]
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // inverse (lower triangle), aliases a
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands Syevd(const Attrs& at, ffi::AnyBuffer& a, Position& position,
               ffi::Result<ffi::AnyBuffer>& v, ffi::Result<ffi::AnyBuffer>& w, Status& status,
               bool& vectors) {
  Operands o = Common(Op::kSyevd, a, v->untyped_data(), position, status, at);
  o.w_out = w->untyped_data();
  o.w_type = w->element_type();
  o.w_dims = w->dimensions();
  o.vectors = vectors;
  return o;
}
template <typename B>
auto SyevdBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()         // a [L, N]
      .template Arg<Position>()               // position []
      .template Ret<ffi::AnyBuffer>()         // vectors, aliases a
      .template Ret<ffi::AnyBuffer>()         // w [N] real
      .template Ret<ffi::Buffer<ffi::S32>>()  // status [1]
      .template Attr<bool>("vectors");
}

Operands Potrf(const Attrs& at, ffi::AnyBuffer& a, Position& position,
               ffi::Result<ffi::AnyBuffer>& factor, Status& status) {
  return Common(Op::kPotrf, a, factor->untyped_data(), position, status, at);
}
template <typename B>
auto PotrfBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // a [L, N]
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // factor (lower triangle), aliases a
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands PotrsFactored(const Attrs& at, ffi::AnyBuffer& factor, ffi::AnyBuffer& b,
                       Position& position, ffi::Result<ffi::AnyBuffer>& x, Status& status) {
  Operands o = Common(Op::kPotrsFactored, factor, factor.untyped_data(), position, status, at);
  WithRhs(&o, b, x);
  return o;
}
template <typename B>
auto PotrsFactoredBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // factor [L, N] (jaxmg_potrf), read only
      .template Arg<ffi::AnyBuffer>()          // b [nrhs, N]
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // x, aliases b
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands PotriFactored(const Attrs& at, ffi::AnyBuffer& factor, Position& position,
                       ffi::Result<ffi::AnyBuffer>& inverse, Status& status) {
  return Common(Op::kPotriFactored, factor, inverse->untyped_data(), position, status, at);
}
template <typename B>
auto PotriFactoredBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // factor [L, N] (jaxmg_potrf)
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // inverse (lower triangle), aliases it
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands Getrf(const Attrs& at, ffi::AnyBuffer& a, Position& position,
               ffi::Result<ffi::AnyBuffer>& lu, ffi::Result<ffi::Buffer<ffi::S32>>& ipiv,
               Status& status) {
  Operands o = Common(Op::kGetrf, a, lu->untyped_data(), position, status, at);
  o.ipiv = ipiv->typed_data();
  o.ipiv_count = ipiv->element_count();
  return o;
}
template <typename B>
auto GetrfBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // a [L, N]
      .template Arg<Position>()                // position []
      .template Ret<ffi::AnyBuffer>()          // L and U, aliases a
      .template Ret<ffi::Buffer<ffi::S32>>()   // pivots [L]
      .template Ret<ffi::Buffer<ffi::S32>>();  // status [1]
}

Operands Getrs(const Attrs& at, ffi::AnyBuffer& lu, Int32s& ipiv, ffi::AnyBuffer& b,
               Position& position, ffi::Result<ffi::AnyBuffer>& x, Status& status, int64_t& trans) {
  Operands o = Common(Op::kGetrs, lu, lu.untyped_data(), position, status, at);
  o.ipiv = ipiv.typed_data();
  o.ipiv_count = ipiv.element_count();
  o.trans = static_cast<char>(trans);
  WithRhs(&o, b, x);
  return o;
}
template <typename B>
auto GetrsBinding(B b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()         // L and U [L, N] (jaxmg_getrf), read only
      .template Arg<Int32s>()                 // pivots [L] (jaxmg_getrf)
      .template Arg<ffi::AnyBuffer>()         // b [nrhs, N]
      .template Arg<Position>()               // position []
      .template Ret<ffi::AnyBuffer>()         // x, aliases b
      .template Ret<ffi::Buffer<ffi::S32>>()  // status [1]
      .template Attr<int64_t>("trans");       // 'N', 'T' or 'C' (as a character code)
}

// --- handlers, generated per routine and platform ---------------------------------------

// Turns a routine's operand function into the two handlers: the routine's own operands
// first, then the attributes of Attrs.
template <auto Build>
struct Entry;
template <typename... Args, Operands (*Build)(const Attrs&, Args&...)>
struct Entry<Build> {
  static ffi::Future Cpu(ffi::RunId run, CpuInstance* instance, Args... args, int64_t tile,
                         Span device_ids, int64_t call_id, int64_t job, Span pids,
                         Span to_cyclic, Span from_cyclic) {
    const Attrs at{tile, device_ids, call_id, job, pids, to_cyclic, from_cyclic};
    return RunOnCpu(Finish(Build(at, args...), at, *instance, run.run_id));
  }
#ifdef JAXMG_WITH_CUDA
  // No instance (instance.h): XLA:GPU runs each GPU's instructions one after another in the
  // program's schedule, the same on every GPU, so the k-th arrival of a call id on each GPU is
  // the same instruction.
  static ffi::Error Cuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                         ffi::RunId run, Args... args, int64_t tile, Span device_ids,
                         int64_t call_id, int64_t job, Span pids, Span to_cyclic,
                         Span from_cyclic) {
    const Attrs at{tile, device_ids, call_id, job, pids, to_cyclic, from_cyclic};
    return RunOnCuda(Finish(Build(at, args...), at, Instance{}, run.run_id), stream, ordinal,
                     scratch);
  }
#endif
  // Attribute `blocks` of a call whose caller discards the result that replaces `a`.
  static constexpr int64_t kBlocksDiscard = 2;
  // Backend "mp": the grid instead of the devices, the processes and the moves; `position` is
  // the flat grid position.
  static ffi::Error Mp(CpuInstance* instance, Args... args, int64_t tile, int64_t n, Span grid,
                       int64_t blocks, int64_t call_id) {
    const Attrs at{tile, Span(), call_id, 0, Span(), Span(), Span()};
    if (grid.size() != 2) return Fail("grid must be (rows, cols)");
    Operands o = Build(at, args...);
    o.instance = instance->Index();
    return RunOnScalapack(o,
                          MpGrid{n, grid[0], grid[1], blocks != 0, blocks != kBlocksDiscard});
  }
#ifdef JAXMG_WITH_CUDA
  // Backend "mp" on GPUs: cuSOLVERMp over the NCCL communicator of `nccl_id`
  // (engines/cusolvermp.h). It takes no instance: its calls meet nothing in the process, and
  // NCCL orders them as each GPU's stream runs them, in the order of the program's schedule,
  // the same on every GPU.
  static ffi::Error MpCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                           Args... args, int64_t tile, int64_t n, Span grid, int64_t blocks,
                           int64_t call_id, Span nccl_id) {
    const Attrs at{tile, Span(), call_id, 0, Span(), Span(), Span()};
    if (grid.size() != 2) return Fail("grid must be (rows, cols)");
    return RunOnCusolverMp(Build(at, args...),
                           MpGrid{n, grid[0], grid[1], blocks != 0, blocks != kBlocksDiscard},
                           nccl_id, stream, ordinal, XlaScratch(scratch));
  }
#endif
};

template <typename B>
auto WithMpAttrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("T_A")
      .template Attr<int64_t>("n")
      .template Attr<Span>("grid")       // (rows, cols) of the process grid
      .template Attr<int64_t>("blocks")  // 0: tiled; 1: a block of P(r, c); 2: and discard
                                         // the result (MpGrid::blocks, result_back)
      .template Attr<int64_t>("call_id");
}

template <typename B>
auto WithAttrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("T_A")
      .template Attr<Span>("device_ids")
      .template Attr<int64_t>("call_id")
      .template Attr<int64_t>("job")  // 0: every participant in this process
      .template Attr<Span>("pids")
      .template Attr<Span>("to_cyclic")
      .template Attr<Span>("from_cyclic");
}

auto CpuContext() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::RunId>()                     // the execution
      .Ctx<ffi::State<CpuInstance>>();       // the instruction (instance.h)
}
auto MpContext() { return ffi::Ffi::Bind().Ctx<ffi::State<CpuInstance>>(); }
auto MpCudaContext() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
      .Ctx<ffi::DeviceOrdinal>()                 // this GPU
      .Ctx<ffi::ScratchAllocator>();             // B, pivots, workspaces
}
// Never declare the command-buffer trait: a handler meets other devices' handlers.
auto CudaContext() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
      .Ctx<ffi::DeviceOrdinal>()                 // this GPU
      .Ctx<ffi::ScratchAllocator>()              // workspace
      .Ctx<ffi::RunId>();                        // the execution
}

// The instantiate stage of each family and platform (instance.h).
ffi::ErrorOr<std::unique_ptr<CpuInstance>> InstantiateCpu(ffi::Dictionary attrs) {
  return Instantiate<CpuInstance, Family::kMg>(std::move(attrs));
}
ffi::ErrorOr<std::unique_ptr<CpuInstance>> InstantiateMpCpu(ffi::Dictionary attrs) {
  return Instantiate<CpuInstance, Family::kMp>(std::move(attrs));
}

}  // namespace
}  // namespace jaxmg

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgInstantiateCpu, jaxmg::InstantiateCpu,
                              xla::ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgInstantiateMpCpu, jaxmg::InstantiateMpCpu,
                              xla::ffi::Ffi::BindInstantiate().Attrs());

#define JAXMG_CPU_TARGET(Name)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Jaxmg##Name##Cpu, jaxmg::Entry<jaxmg::Name>::Cpu, \
                                jaxmg::WithAttrs(jaxmg::Name##Binding(jaxmg::CpuContext())))
#ifdef JAXMG_WITH_CUDA
#define JAXMG_CUDA_TARGET(Name)                                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Jaxmg##Name##Cuda, jaxmg::Entry<jaxmg::Name>::Cuda, \
                                jaxmg::WithAttrs(jaxmg::Name##Binding(jaxmg::CudaContext())))
#else
#define JAXMG_CUDA_TARGET(Name)
#endif
#define JAXMG_MP_TARGET(Name)                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMp##Name##Cpu, jaxmg::Entry<jaxmg::Name>::Mp, \
                                jaxmg::WithMpAttrs(jaxmg::Name##Binding(jaxmg::MpContext())))
#ifdef JAXMG_WITH_CUDA
#define JAXMG_MP_CUDA_TARGET(Name)                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                       \
      JaxmgMp##Name##Cuda, jaxmg::Entry<jaxmg::Name>::MpCuda,          \
      jaxmg::WithMpAttrs(jaxmg::Name##Binding(jaxmg::MpCudaContext())) \
          .Attr<jaxmg::Span>("nccl_id"))  // the NCCL unique id, 16 int64
#else
#define JAXMG_MP_CUDA_TARGET(Name)
#endif
#define JAXMG_TARGET(Name) \
  JAXMG_CPU_TARGET(Name);  \
  JAXMG_CUDA_TARGET(Name); \
  JAXMG_MP_TARGET(Name);   \
  JAXMG_MP_CUDA_TARGET(Name)

// Every routine, by the name of its operand function (Op::k<Name>).
#define JAXMG_ROUTINES(X) \
  X(Potrs) X(Potri) X(Syevd) X(Potrf) X(PotrsFactored) X(PotriFactored) X(Getrf) X(Getrs)

#define JAXMG_DEFINE(Name) JAXMG_TARGET(Name);
JAXMG_ROUTINES(JAXMG_DEFINE)
#undef JAXMG_DEFINE

// Backend "mp"'s rectangular routines (engines/mp.h, RectOperands): on CPUs the block of A
// [N/cols, M/rows], on GPUs (qr and gels) its local array in tiles, and the position in; the
// results whole on every process, or (gesvd on CPUs and qr, attribute `blocks`) as A went in.
namespace jaxmg {
namespace {

template <typename B>
auto WithRectAttrs(B b) {
  return std::move(b)
      .template Attr<int64_t>("T_A")
      .template Attr<int64_t>("m")
      .template Attr<int64_t>("n")
      .template Attr<Span>("grid")  // (rows, cols) of the process grid
      .template Attr<int64_t>("call_id");
}

RectOperands Rect(RectOp op, const char* target, int64_t instance, ffi::AnyBuffer& a,
                  Position& position, int64_t tile, int64_t m, int64_t n, Span grid,
                  int64_t call_id) {
  RectOperands o;
  o.op = op;
  o.target = target;
  o.a = &a;
  o.position = position.typed_data();
  o.position_count = position.element_count();
  o.m = m;
  o.n = n;
  o.rows = grid.size() == 2 ? grid[0] : 0;
  o.cols = grid.size() == 2 ? grid[1] : 0;
  o.tile = tile;
  o.call_id = call_id;
  o.instance = instance;
  return o;
}

ffi::Error MpGesvd(CpuInstance* instance, ffi::AnyBuffer a, Position position,
                   ffi::Result<ffi::AnyBuffer> u, ffi::Result<ffi::AnyBuffer> s,
                   ffi::Result<ffi::AnyBuffer> vt, Status status, int64_t tile, int64_t m,
                   int64_t n, Span grid, int64_t call_id, int64_t blocks) {
  RectOperands o = Rect(RectOp::kGesvd, "jaxmg_mp_gesvd", instance->Index(), a, position, tile,
                        m, n, grid, call_id);
  o.out0 = u->untyped_data();
  o.out0_dims = u->dimensions();
  o.out1 = s->untyped_data();
  o.out2 = vt->untyped_data();
  o.out2_dims = vt->dimensions();
  o.blocks = blocks != 0;
  o.status = status->typed_data();
  if (s->element_type() != RealTypeOf(DtypeOf(a.element_type()).value_or(Dtype::kF32)) ||
      s->element_count() != static_cast<size_t>(std::min(m, n)))
    return Fail("jaxmg_mp_gesvd: s must be [K] of A's real dtype");
  return RunRectOnScalapack(o);
}

ffi::Error MpQr(CpuInstance* instance, ffi::AnyBuffer a, Position position,
                ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> r, Status status,
                int64_t tile, int64_t m, int64_t n, Span grid, int64_t call_id, int64_t blocks) {
  RectOperands o =
      Rect(RectOp::kQr, "jaxmg_mp_qr", instance->Index(), a, position, tile, m, n, grid, call_id);
  o.out0 = q->untyped_data();
  o.out0_dims = q->dimensions();
  o.out1 = r->untyped_data();
  o.out1_dims = r->dimensions();
  o.blocks = blocks != 0;
  o.status = status->typed_data();
  return RunRectOnScalapack(o);
}

ffi::Error MpGels(CpuInstance* instance, ffi::AnyBuffer a, ffi::AnyBuffer b, Position position,
                  ffi::Result<ffi::AnyBuffer> x, Status status, int64_t tile, int64_t m,
                  int64_t n, Span grid, int64_t call_id) {
  RectOperands o =
      Rect(RectOp::kGels, "jaxmg_mp_gels", instance->Index(), a, position, tile, m, n, grid,
           call_id);
  o.b = &b;
  o.out0 = x->untyped_data();
  o.out0_dims = x->dimensions();
  o.status = status->typed_data();
  return RunRectOnScalapack(o);
}

#ifdef JAXMG_WITH_CUDA
// On GPUs: cuSOLVERMp over the NCCL communicator of `nccl_id`, no instance (as Entry::MpCuda).
ffi::Error MpQrCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                    ffi::AnyBuffer a, Position position, ffi::Result<ffi::AnyBuffer> q,
                    ffi::Result<ffi::AnyBuffer> r, Status status, int64_t tile, int64_t m,
                    int64_t n, Span grid, int64_t call_id, Span nccl_id, int64_t blocks) {
  // No instance: the GPU engine meets no one (as Entry::MpCuda). The engine checks Q's and R's
  // shapes (CusolverMpResultDims).
  RectOperands o = Rect(RectOp::kQr, "jaxmg_mp_qr", 0, a, position, tile, m, n, grid, call_id);
  o.out0 = q->untyped_data();
  o.out0_dims = q->dimensions();
  o.out1 = r->untyped_data();
  o.out1_dims = r->dimensions();
  o.blocks = blocks != 0;
  o.status = status->typed_data();
  return RunRectOnCusolverMp(o, nccl_id, stream, ordinal, XlaScratch(scratch));
}

ffi::Error MpGelsCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                      ffi::AnyBuffer a, ffi::AnyBuffer b, Position position,
                      ffi::Result<ffi::AnyBuffer> x, Status status, int64_t tile, int64_t m,
                      int64_t n, Span grid, int64_t call_id, Span nccl_id) {
  RectOperands o = Rect(RectOp::kGels, "jaxmg_mp_gels", 0, a, position, tile, m, n, grid, call_id);
  o.b = &b;
  o.out0 = x->untyped_data();
  o.out0_dims = x->dimensions();
  o.status = status->typed_data();
  const auto bd = b.dimensions();
  if (bd.size() != 2 || x->element_count() != static_cast<size_t>(n * bd[1]))
    return Fail("jaxmg_mp_gels: b must be [M, nrhs] and x [N, nrhs]");
  return RunRectOnCusolverMp(o, nccl_id, stream, ordinal, XlaScratch(scratch));
}
#endif

}  // namespace
}  // namespace jaxmg

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMpGesvdCpu, jaxmg::MpGesvd,
                              jaxmg::WithRectAttrs(jaxmg::MpContext()
                                                       .Arg<xla::ffi::AnyBuffer>()  // a block
                                                       .Arg<jaxmg::Position>()      // position
                                                       .Ret<xla::ffi::AnyBuffer>()  // U [M, K]
                                                       .Ret<xla::ffi::AnyBuffer>()  // s [K]
                                                       .Ret<xla::ffi::AnyBuffer>()  // VT [K, N]
                                                       .Ret<xla::ffi::Buffer<xla::ffi::S32>>())
                                  .Attr<int64_t>("blocks"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMpQrCpu, jaxmg::MpQr,
                              jaxmg::WithRectAttrs(jaxmg::MpContext()
                                                       .Arg<xla::ffi::AnyBuffer>()  // a block
                                                       .Arg<jaxmg::Position>()      // position
                                                       .Ret<xla::ffi::AnyBuffer>()  // Q [M, K]
                                                       .Ret<xla::ffi::AnyBuffer>()  // R [K, N]
                                                       .Ret<xla::ffi::Buffer<xla::ffi::S32>>())
                                  .Attr<int64_t>("blocks"));
#ifdef JAXMG_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMpQrCuda, jaxmg::MpQrCuda,
                              jaxmg::WithRectAttrs(jaxmg::MpCudaContext()
                                                       .Arg<xla::ffi::AnyBuffer>()  // a tiles
                                                       .Arg<jaxmg::Position>()      // position
                                                       .Ret<xla::ffi::AnyBuffer>()  // Q [M, K]
                                                       .Ret<xla::ffi::AnyBuffer>()  // R [K, N]
                                                       .Ret<xla::ffi::Buffer<xla::ffi::S32>>())
                                  .Attr<jaxmg::Span>("nccl_id")
                                  .Attr<int64_t>("blocks"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMpGelsCuda, jaxmg::MpGelsCuda,
                              jaxmg::WithRectAttrs(jaxmg::MpCudaContext()
                                                       .Arg<xla::ffi::AnyBuffer>()  // a tiles
                                                       .Arg<xla::ffi::AnyBuffer>()  // b [M, nrhs]
                                                       .Arg<jaxmg::Position>()      // position
                                                       .Ret<xla::ffi::AnyBuffer>()  // x [N, nrhs]
                                                       .Ret<xla::ffi::Buffer<xla::ffi::S32>>())
                                  .Attr<jaxmg::Span>("nccl_id"));
#endif
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgMpGelsCpu, jaxmg::MpGels,
                              jaxmg::WithRectAttrs(jaxmg::MpContext()
                                                       .Arg<xla::ffi::AnyBuffer>()  // a block
                                                       .Arg<xla::ffi::AnyBuffer>()  // b [M, nrhs]
                                                       .Arg<jaxmg::Position>()      // position
                                                       .Ret<xla::ffi::AnyBuffer>()  // x [N, nrhs]
                                                       .Ret<xla::ffi::Buffer<xla::ffi::S32>>()));

namespace jaxmg {
namespace {

// One routine's handlers: backend "mg" and "mp", each on CPUs and CUDA (nullptr without CUDA).
struct Handlers {
  Op op;
  void* cpu;
  void* cuda;
  void* mp_cpu;
  void* mp_cuda;
};

#ifdef JAXMG_WITH_CUDA
#define JAXMG_CUDA_HANDLER(symbol) reinterpret_cast<void*>(symbol)
#else
#define JAXMG_CUDA_HANDLER(symbol) nullptr
#endif

const std::vector<Handlers>& AllHandlers() {
#define JAXMG_ROW(Name)                                                                        \
  Handlers{Op::k##Name, reinterpret_cast<void*>(Jaxmg##Name##Cpu),                             \
           JAXMG_CUDA_HANDLER(Jaxmg##Name##Cuda), reinterpret_cast<void*>(JaxmgMp##Name##Cpu), \
           JAXMG_CUDA_HANDLER(JaxmgMp##Name##Cuda)},
  static const auto* table = new std::vector<Handlers>{JAXMG_ROUTINES(JAXMG_ROW)};
#undef JAXMG_ROW
  return *table;
}
#undef JAXMG_CUDA_HANDLER

}  // namespace

std::vector<Target> Targets(bool cuda) {
  std::vector<Target> out;
  // CPU targets only: see Entry::Cuda.
  void* instantiate = cuda ? nullptr : reinterpret_cast<void*>(JaxmgInstantiateCpu);
  for (const Handlers& h : AllHandlers()) {
    void* execute = cuda ? h.cuda : h.cpu;
    if (execute != nullptr) out.push_back({RoutineOf(h.op).target, instantiate, execute});
  }
  return out;
}

std::vector<Target> MpTargets(bool cuda) {
  std::vector<Target> out;
  void* instantiate = cuda ? nullptr : reinterpret_cast<void*>(JaxmgInstantiateMpCpu);
  for (const Handlers& h : AllHandlers()) {
    void* execute = cuda ? h.mp_cuda : h.mp_cpu;
    if (execute != nullptr)
      out.push_back({"jaxmg_mp_" + RoutineOf(h.op).name, instantiate, execute});
  }
  if (!cuda) {  // the rectangular routines: gesvd on ScaLAPACK only
    out.push_back({"jaxmg_mp_gesvd", instantiate, reinterpret_cast<void*>(JaxmgMpGesvdCpu)});
    out.push_back({"jaxmg_mp_qr", instantiate, reinterpret_cast<void*>(JaxmgMpQrCpu)});
    out.push_back({"jaxmg_mp_gels", instantiate, reinterpret_cast<void*>(JaxmgMpGelsCpu)});
  }
#ifdef JAXMG_WITH_CUDA
  if (cuda) {
    out.push_back({"jaxmg_mp_qr", nullptr, reinterpret_cast<void*>(JaxmgMpQrCuda)});
    out.push_back({"jaxmg_mp_gels", nullptr, reinterpret_cast<void*>(JaxmgMpGelsCuda)});
  }
#endif
  return out;
}

}  // namespace jaxmg
