#include "rendezvous.h"

#include <cstdlib>
#include <sstream>

namespace jaxmg {

double TimeoutSeconds() {
  const char* text = std::getenv("JAXMG_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return 60.0;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  return (end != text && value > 0) ? value : 60.0;
}

bool Meeting::Claim(int position, const Slot& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_[position].arrived) return false;
  slots_[position] = slot;
  slots_[position].arrived = true;
  return true;
}

void Meeting::Publish(int position, const Slot& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[position] = slot;
  slots_[position].arrived = true;
}

Slot Meeting::Get(int position) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[position];
}

std::vector<Slot> Meeting::Slots() {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
}

Outcome Meeting::Phase(int phase, Outcome own, const std::function<Outcome()>& leader) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!own.ok && !failed_) {
    failed_ = true;
    error_ = own.message;
    cv_.notify_all();
  }
  int arrived = ++arrived_[phase];
  if (failed_) return Outcome::Fail(error_);
  if (arrived == n_) {
    // Everyone is here: this participant leads. The others' buffers stay valid because none
    // of them returns before done_[phase] is set.
    lock.unlock();
    Outcome result = leader();
    lock.lock();
    if (!result.ok && !failed_) {
      failed_ = true;
      error_ = result.message;
    }
    done_[phase] = true;
    cv_.notify_all();
    return failed_ ? Outcome::Fail(error_) : Outcome{};
  }
  const double seconds = TimeoutSeconds();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  while (!done_[phase] && !failed_) {
    if (arrived_[phase] == n_) {
      cv_.wait(lock);  // the leader is computing with our buffers: wait for it
      continue;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !done_[phase] &&
        !failed_ && arrived_[phase] < n_) {
      std::ostringstream message;
      message << "jaxmg: timed out after " << seconds << " s (JAXMG_TIMEOUT_S) waiting for the "
              << "participants of call " << key_ << " at phase " << phase << ": "
              << arrived_[phase] << " of " << n_ << " arrived. Every device of the mesh axis "
              << "must run the call; the participant count comes from the mesh.";
      failed_ = true;
      error_ = message.str();
      cv_.notify_all();
      lock.unlock();
      Registry::Get().Retire(shared_from_this());
      return Outcome::Fail(message.str());
    }
  }
  return failed_ ? Outcome::Fail(error_) : Outcome{};
}

Registry& Registry::Get() {
  static Registry* registry = new Registry();  // never destroyed: handlers may outlive exit
  return *registry;
}

std::shared_ptr<Meeting> Registry::Join(const std::string& key, int participants,
                                        bool exact) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exact) {
    for (auto g = gone_.begin(); g != gone_.end(); ++g) {
      if (g->meeting->key() != key || g->meeting->participants() != participants) continue;
      auto meeting = g->meeting;
      if (++g->joined == participants) gone_.erase(g);  // the last straggler: forget it
      return meeting;
    }
  }
  auto it = open_.find(key);
  if (it == open_.end() || it->second.meeting->participants() != participants) {
    auto meeting = std::make_shared<Meeting>(key, participants, exact);
    if (participants > 1) open_[key] = Open{meeting, 1};
    return meeting;
  }
  auto meeting = it->second.meeting;
  if (++it->second.joined == participants) open_.erase(it);
  return meeting;
}

void Registry::Retire(const std::shared_ptr<Meeting>& meeting) {
  if (!meeting) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(meeting->key());
  if (it == open_.end() || it->second.meeting != meeting) return;
  if (meeting->exact_) {
    gone_.push_back(it->second);
    if (gone_.size() > kGone) gone_.pop_front();
  }
  open_.erase(it);
}

size_t Registry::open_meetings() {
  std::lock_guard<std::mutex> lock(mu_);
  return open_.size();
}

}  // namespace jaxmg
