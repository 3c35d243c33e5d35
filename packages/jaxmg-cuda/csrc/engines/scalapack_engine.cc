// The ScaLAPACK engine (scalapack_engine.h): the one Engine of the process, the agreement of
// every process on the order of calls (one BLACS max-reduction over the world grid), and the
// BLACS contexts of the grids.
#include "engines/scalapack_engine.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/timeout.h"

namespace jaxmg::scalapack {

Engine& Engine::Get() {
  static auto* engine = new Engine();
  return *engine;
}

Outcome Engine::World(Int* context) {
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

Outcome Engine::WaitForTurn(std::unique_lock<std::mutex>& lock, CallOrder id,
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

Outcome Engine::Agree(CallOrder id, Proposals* out) {
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

Outcome Engine::GridContext(const MpGrid& grid, int64_t position, Int* context) {
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

}  // namespace jaxmg::scalapack
