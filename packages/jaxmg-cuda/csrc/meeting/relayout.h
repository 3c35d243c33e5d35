// The in-place relayout executor: the leader moves column ranges between the participants'
// blocks and staging buffers (jaxmg_layout.in_place_moves, base/operands.h: to_cyclic and
// from_cyclic), a round at a time, before and after the library runs.
#ifndef JAXMG_RELAYOUT_H_
#define JAXMG_RELAYOUT_H_

#include <cstdint>
#include <string>

#include "base/backend.h"
#include "base/common.h"

namespace jaxmg {

// "" when `moves` are well formed for `p`, else what is wrong; raises p->staging to the
// staging columns they use.
std::string CheckMoves(const char* target, const char* name, ffi::Span<const int64_t> moves,
                       Problem* p);

// Runs `moves` on the call's blocks (`call.a`) and staging buffers (the start of `call.work`).
Outcome ApplyMoves(ffi::Span<const int64_t> moves, const Problem& p, Backend& backend,
                   const MgCall& call);

}  // namespace jaxmg

#endif  // JAXMG_RELAYOUT_H_
