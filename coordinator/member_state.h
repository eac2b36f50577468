// Where each member of an open round stands: the table the round's parts share.
//
// The coordinator's round loop owns the table (one per round); the parts that move members through
// it are the synchronous round's scheduler (sync_round.h), the upload slots' grants, and
// the secure aggregation (secure_round.h), which alone uses kSecAgg and kSecAggMasking. A member
// only ever leaves the table's open states through kDone or kFailed, and never comes back from
// either within the round.
//
// Thread-safety: none (the round loop's thread).
#pragma once

#include <map>
#include <string>

namespace huddle::coordinator {

enum class MemberState {
  kTraining,       // sent its FitInstruction; its upload request (or, securely, its keys) is due
  kWaitingSlot,    // asked for an upload slot, queued (upload_slots.h)
  kUploading,      // holds an upload grant; its result (or masked input) is due
  kDone,           // its update was folded (or, securely, it survived to the unmasking)
  kFailed,         // out of the round: silent, refused, declined, unreachable or late
  kSecAgg,         // in secure aggregation's stages past training (SecureRound says which)
  kSecAggMasking,  // secure aggregation: its masked input is due (it asks for an upload slot)
};

// The round's members by client id.
using RoundMembers = std::map<std::string, MemberState>;

// Whether `state` is still open (neither kDone nor kFailed).
inline bool IsOpen(MemberState state) {
  return state != MemberState::kDone && state != MemberState::kFailed;
}

}  // namespace huddle::coordinator
