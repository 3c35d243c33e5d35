"""The meeting registry (csrc/meeting/rendezvous.h) driven directly from Python threads.

End-to-end tests through jax cannot catch a meeting that mixes two executions on CPU: XLA:CPU
in jax 0.10 never overlaps executions. Here each thread is one participant of one call
(``rendezvous_join``); arrivals are ordered by waiting for the registry to show a participant
waiting, never by sleeping, so nothing depends on how fast the machine is. Keys are
``<call>@run<id>`` as the handlers build them from XLA's RunId.
"""

import itertools
import threading
import time
import uuid

import pytest

from jaxmg_cuda import _jaxmg_cuda as native

LONG = "120"  # a deadline that no participant of a meeting that completes ever reaches


def run_key(call, run):
    return f"{call}@run{run}"


def join(key, participants, position, tag):
    """One participant of the call ``key`` (it names its execution: exact)."""
    return native.rendezvous_join(key, participants, position, tag, exact=True)


class Participant:
    """One participant in its own thread; ``result`` once it returned."""

    def __init__(self, key, participants, position, tag):
        self.result = None
        self.thread = threading.Thread(
            target=self._run, args=(key, participants, position, tag), daemon=True
        )
        self.thread.start()

    def _run(self, *args):
        self.result = join(*args)

    def join(self):
        self.thread.join(timeout=600)
        assert self.result is not None, "the participant never returned"
        return self.result


def wait_until_waiting(open_meetings, *participants):
    """Until the registry holds ``open_meetings`` open meetings, or one of ``participants``
    returned (then the caller's assertions say what went wrong)."""
    deadline = time.monotonic() + 600
    while native.open_meetings() != open_meetings:
        if any(not p.thread.is_alive() for p in participants):
            return
        assert time.monotonic() < deadline, "the registry never showed the participant"
        time.sleep(0.001)


@pytest.fixture
def call():
    """A call key of its own for every test; the registry is process-wide."""
    assert native.open_meetings() == 0
    yield f"test_registry:{uuid.uuid4().hex}"
    assert native.open_meetings() == 0


def test_late_participant_gets_its_own_meetings_error(call, monkeypatch):
    """Run 1's position 0 times out alone; its position 1 arrives while run 2 is gathering:
    it gets run 1's error at once and never joins run 2, which completes with exactly its own
    participants."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "0.2")
    first = join(run_key(call, 1), 2, 0, 10)
    assert not first["ok"] and "timed out" in first["message"], first
    monkeypatch.setenv("JAXMG_TIMEOUT_S", LONG)

    r2p0 = Participant(run_key(call, 2), 2, 0, 20)
    wait_until_waiting(1, r2p0)
    assert r2p0.thread.is_alive(), r2p0.result  # run 2 has nothing to do with run 1
    late = join(run_key(call, 1), 2, 1, 11)  # returns at once: no deadline
    assert not late["ok"], late
    assert late["message"] == first["message"]
    assert late["tags"] == [10, 11]  # run 1's meeting, and nobody else's
    assert r2p0.thread.is_alive()  # still waiting for its own position 1
    assert native.open_meetings() == 1

    r2p1 = join(run_key(call, 2), 2, 1, 21)
    assert r2p1 == {"ok": True, "message": "", "claimed": True, "tags": [20, 21]}
    assert r2p0.join() == r2p1

    # The next straggler of run 1 (there is none left) would start a fresh meeting: run 1 is
    # forgotten once all its participants came.
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "0.2")
    again = join(run_key(call, 1), 2, 1, 12)
    assert not again["ok"] and again["tags"] == [None, 12], again


def test_runs_of_one_call_never_mix(call, monkeypatch):
    """Two executions of one call (same device ids, different RunIds) gathering side by side,
    each position waiting on the other run's: each completes with its own participants."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", LONG)
    r1p0 = Participant(run_key(call, 1), 2, 0, 10)
    wait_until_waiting(1, r1p0)
    r2p1 = Participant(run_key(call, 2), 2, 1, 21)
    wait_until_waiting(2, r1p0, r2p1)
    assert r1p0.thread.is_alive() and r2p1.thread.is_alive(), (r1p0.result, r2p1.result)
    r2p0 = Participant(run_key(call, 2), 2, 0, 20)
    r1p1 = Participant(run_key(call, 1), 2, 1, 11)
    for p, tags in ((r1p0, [10, 11]), (r1p1, [10, 11]), (r2p0, [20, 21]), (r2p1, [20, 21])):
        assert p.join() == {"ok": True, "message": "", "claimed": True, "tags": tags}


def test_many_runs_at_once_never_mix(call, monkeypatch):
    """Eight executions of one 3-participant call, all participants started at once in an
    interleaved order: every meeting holds exactly one run's participants."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", LONG)
    runs, n = 8, 3
    order = [(run, pos) for pos, run in itertools.product(range(n), range(runs))]
    people = {
        (run, pos): Participant(run_key(call, run), n, pos, 10 * run + pos) for run, pos in order
    }
    for (run, _), p in people.items():
        result = p.join()
        assert result["ok"], result
        assert result["tags"] == [10 * run + q for q in range(n)], result


def test_two_claims_of_one_position(call, monkeypatch):
    """Two participants of one meeting claim mesh position 0: both get the claim error, and
    neither waits for the position nobody took."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", LONG)
    first = Participant(run_key(call, 1), 2, 0, 10)
    wait_until_waiting(1, first)
    assert first.thread.is_alive(), first.result
    second = join(run_key(call, 1), 2, 0, 11)
    claim = f"two participants claim mesh position 0 of call {run_key(call, 1)}"
    assert second == {"ok": False, "message": claim, "claimed": False, "tags": [10, None]}
    assert first.join() == second | {"claimed": True}
