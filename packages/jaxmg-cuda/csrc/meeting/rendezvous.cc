#include "meeting/rendezvous.h"

#include <pthread.h>

#include <cstdlib>
#include <deque>
#include <sstream>
#include <thread>
#include <utility>

namespace jaxmg {

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
      failed_ = true;
      error_ = TimeoutMessage(seconds, arrived_[phase], " at phase " + std::to_string(phase));
      cv_.notify_all();
      lock.unlock();
      Registry::Get().Retire(shared_from_this());
      return Outcome::Fail(error_);
    }
  }
  return failed_ ? Outcome::Fail(error_) : Outcome{};
}

std::string Meeting::TimeoutMessage(double seconds, int arrived, const std::string& where) const {
  std::ostringstream message;
  message << "jaxmg: timed out after " << seconds << " s (JAXMG_TIMEOUT_S) waiting for the "
          << "participants of call " << key_ << where << ": " << arrived << " of " << n_
          << " arrived. Every device of the mesh axis must run the call; the participant count "
          << "comes from the mesh.";
  return message.str();
}

// --- Arrive(): threads for the others' completions, and the arrival deadlines ---------------

namespace {

// The pool of RunAlone: `idle_` threads wait for a task; a task finding none starts a new
// thread. Never destroyed: its threads may outlive exit.
class Alone {
 public:
  static Alone& Get() {
    static auto* pool = new Alone();
    return *pool;
  }

  void Run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (idle_ > 0) {
      --idle_;
      cv_.notify_one();
    } else {
      std::thread([this] { Work(); }).detach();
    }
  }

 private:
  void Work() {
    pthread_setname_np(pthread_self(), "jaxmg-continue");
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return !tasks_.empty(); });
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++idle_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
};

// Completes the others' arrivals, each on a thread of its own.
void CompleteAll(std::vector<Completion> waiting, const Outcome& outcome) {
  for (Completion& done : waiting) {
    RunAlone([done = std::move(done), outcome] { done(outcome); });
  }
}

}  // namespace

void RunAlone(std::function<void()> task) { Alone::Get().Run(std::move(task)); }

// The arrival deadlines of Arrive(): one thread sleeps until the earliest and expires the
// meetings whose deadline passed. Never destroyed, like the registry.
class Deadlines {
 public:
  static Deadlines& Get() {
    static auto* deadlines = new Deadlines();
    return *deadlines;
  }

  uint64_t Add(const std::shared_ptr<Meeting>& meeting, std::chrono::steady_clock::time_point at) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      std::thread([this] { Watch(); }).detach();
      started_ = true;
    }
    const uint64_t id = ++last_;
    entries_.emplace(Entry{at, id}, meeting);
    cv_.notify_all();
    return id;
  }

  void Remove(std::chrono::steady_clock::time_point at, uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(Entry{at, id});
  }

 private:
  using Entry = std::pair<std::chrono::steady_clock::time_point, uint64_t>;

  void Watch() {
    pthread_setname_np(pthread_self(), "jaxmg-deadlines");
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (entries_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const auto first = entries_.begin();
      if (std::chrono::steady_clock::now() < first->first.first) {
        cv_.wait_until(lock, first->first.first);
        continue;
      }
      std::weak_ptr<Meeting> meeting = first->second;
      entries_.erase(first);
      lock.unlock();
      if (std::shared_ptr<Meeting> m = meeting.lock()) m->Expire();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Entry, std::weak_ptr<Meeting>> entries_;
  uint64_t last_ = 0;
  bool started_ = false;
};

void Meeting::Arrive(Outcome own, Completion done, const std::function<Outcome()>& leader) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!own.ok && !failed_) {
    failed_ = true;
    error_ = own.message;
  }
  ++arrivals_;
  if (failed_) {
    std::vector<Completion> waiting = std::move(waiting_);
    const Outcome failure = Outcome::Fail(error_);
    lock.unlock();
    CompleteAll(std::move(waiting), failure);
    done(failure);
    return;
  }
  if (arrivals_ < n_) {
    waiting_.push_back(std::move(done));
    if (arrivals_ == 1) {
      seconds_ = TimeoutSeconds();
      deadline_at_ = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds_));
      deadline_ = Deadlines::Get().Add(shared_from_this(), deadline_at_);
    }
    return;
  }
  // Everyone is here: this participant leads. The others' buffers stay valid: their
  // futures are not complete.
  lock.unlock();
  Outcome result = leader();
  lock.lock();
  if (!result.ok && !failed_) {
    failed_ = true;
    error_ = result.message;
  }
  const Outcome outcome = failed_ ? Outcome::Fail(error_) : Outcome{};
  std::vector<Completion> waiting = std::move(waiting_);
  const uint64_t deadline = deadline_;
  const auto deadline_at = deadline_at_;
  deadline_ = 0;
  lock.unlock();
  if (deadline != 0) Deadlines::Get().Remove(deadline_at, deadline);
  CompleteAll(std::move(waiting), outcome);
  done(outcome);
}

void Meeting::Expire() {
  std::unique_lock<std::mutex> lock(mu_);
  deadline_ = 0;
  if (failed_ || arrivals_ == n_) return;  // failed already, or the leader is at work
  failed_ = true;
  error_ = TimeoutMessage(seconds_, arrivals_, "");
  std::vector<Completion> waiting = std::move(waiting_);
  const Outcome failure = Outcome::Fail(error_);
  lock.unlock();
  Registry::Get().Retire(shared_from_this());
  CompleteAll(std::move(waiting), failure);
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
