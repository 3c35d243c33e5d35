#include "meeting/relayout.h"

#include <algorithm>
#include <string>
#include <vector>

namespace jaxmg {

// Whole (round, source, destination, width) rows
// in round order, positive widths, every range inside one position's block or one position's
// staging buffer, no move onto its own source. Sets p->staging.
std::string CheckMoves(const char* target, const char* name, ffi::Span<const int64_t> moves,
                       Problem* p) {
  const std::string err = Cat(target, ": ", name, ": ");
  if (moves.size() % 4 != 0)
    return err + Cat("expected (round, source, destination, width) rows, got ", moves.size(),
                     " values");
  const int64_t ends = p->ndev * p->local;  // each position's staging buffer follows
  for (size_t m = 0; m < moves.size(); m += 4) {
    const int64_t round = moves[m], src = moves[m + 1], dst = moves[m + 2], width = moves[m + 3];
    auto inside = [&](int64_t at) {
      if (at < 0 || at >= 2 * ends || at / p->local != (at + width - 1) / p->local) return false;
      if (at >= ends) p->staging = std::max(p->staging, (at - ends) % p->local + width);
      return true;
    };
    const bool ordered = round >= 0 && (m == 0 || round >= moves[m - 4]);
    if (!ordered || width < 1 || !inside(src) || !inside(dst) ||
        (src < dst + width && dst < src + width)) {
      return err + Cat("move ", m / 4, " (", round, ", ", src, ", ", dst, ", ", width,
                       ") is out of round order or not a column range of one block (L=",
                       p->local, ", positions [0, ", ends, ")) or staging buffer ([", ends, ", ",
                       2 * ends, ")) to a disjoint one");
    }
  }
  return "";
}

// The leader moves column ranges between the positions' blocks and staging buffers (at the
// start of each position's workspace), one round at a time.
Outcome ApplyMoves(ffi::Span<const int64_t> moves, const Problem& p, Backend& backend,
                   const MgCall& call) {
  const size_t column = static_cast<size_t>(p.n) * ElementSize(p.dtype);
  const int64_t ends = p.ndev * p.local;
  auto at = [&](int64_t position, int* device) -> char* {
    const bool staged = position >= ends;
    const int64_t q = (staged ? position - ends : position) / p.local;
    *device = call.devices[q];
    char* base = static_cast<char*>(staged ? call.work[q] : call.a[q]);
    return base + static_cast<size_t>(position % p.local) * column;
  };
  std::vector<Copy> round;
  for (size_t m = 0; m < moves.size(); m += 4) {
    Copy c{};
    c.src = at(moves[m + 1], &c.src_device);
    c.dst = at(moves[m + 2], &c.dst_device);
    c.bytes = static_cast<size_t>(moves[m + 3]) * column;
    round.push_back(c);
    if (m + 4 == moves.size() || moves[m + 4] != moves[m]) {
      if (Outcome r = backend.CopyAll(round); !r.ok) return r;
      round.clear();
    }
  }
  return {};
}

}  // namespace jaxmg
