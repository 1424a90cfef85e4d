"""The replica set's parts on their own, with scripted servers: fan-out, push phases, membership."""

from __future__ import annotations

import pytest

from ringzero.errors import RingzeroError, ServerUnreachable
from ringzero.rollout.replicas.fan_out import Failed, attempt, each
from ringzero.rollout.replicas.membership import Membership
from ringzero.rollout.replicas.push_phases import EachReplica, OneBroadcast, push_phases


class Server:
    """A scripted server: records every call; ``refuse`` names calls it refuses, ``pause`` is False for a
    server without pause (it answers 404: the phase is skipped), ``session`` likewise for update sessions."""

    def __init__(self, endpoint, refuse=(), pause=True, session=True, healthy=True):
        self.endpoint, self.refuse, self.calls = endpoint, set(refuse), []
        self.has_pause, self.has_session, self.healthy = pause, session, healthy
        self.routing_shape, self.closed = None, False

    def _call(self, name, answer=True):
        self.calls.append(name)
        if name in self.refuse:
            raise RingzeroError(f"{name} refused")
        return answer

    def pause_generation(self):
        return self._call("pause", self.has_pause)

    def continue_generation(self):
        return self._call("continue")

    def begin_weight_update(self):
        return self._call("begin", self.has_session)

    def end_weight_update(self):
        return self._call("end")

    def load(self):
        return self._call("load")

    def health(self):
        return self.healthy

    def close(self):
        self.closed = True


def test_attempt_hands_back_each_failure_named_by_its_replica_and_each_raises_them():
    a, b = Server("http://a", refuse={"load"}), Server("http://b")
    answers = attempt(lambda c: c.load(), [(a,), (b,)], "load")
    assert isinstance(answers[0], Failed) and answers[1] is True
    assert "rollout replica http://a refused the load: load refused" in str(answers[0].exc)
    lost = Server("http://c")
    lost.load = lambda: (_ for _ in ()).throw(ServerUnreachable("reset"))
    assert isinstance(attempt(lambda c: c.load(), [(lost,)], "load")[0].exc, ServerUnreachable)
    with pytest.raises(RingzeroError, match="http://a refused the load"):
        each(lambda c: c.load(), [(a,), (b,)], "load")


def test_each_replica_loads_between_pause_and_continue_without_a_session():
    servers = [Server("http://a"), Server("http://b", pause=False)]
    push_phases(servers, "v1", EachReplica(lambda c: c.load()))
    assert servers[0].calls == ["pause", "load", "continue"]
    assert servers[1].calls == ["pause", "load"]  # no pause: nothing to continue


def test_one_broadcast_runs_once_inside_the_session_of_the_servers_that_have_one():
    servers, sent = [Server("http://a"), Server("http://b", session=False)], []
    push_phases(servers, "v2", OneBroadcast(lambda: sent.append(1)))
    assert sent == [1]
    assert servers[0].calls == ["pause", "begin", "end", "continue"]
    assert servers[1].calls == ["pause", "begin", "continue"]


def test_a_refused_update_still_continues_the_paused_replicas():
    servers = [Server("http://a", refuse={"load"}), Server("http://b")]
    with pytest.raises(RingzeroError, match="http://a refused the weight push 'v3'"):
        push_phases(servers, "v3", EachReplica(lambda c: c.load()))
    assert all(s.calls[-1] == "continue" for s in servers)


def test_recovery_drops_gone_replicas_adds_new_ones_and_serves_only_those_brought_back():
    a, b, gone = Server("http://a"), Server("http://b"), Server("http://gone")
    found = ["http://a", "http://b", "http://new/"]
    m = Membership([a, b, gone], lambda e: Server(e), lambda: found, recheck_s=30.0, rejoin_wait_s=0.0)
    m.lose(b, "reset")
    m.lose(gone, "reset")
    assert [c.endpoint for c in m.live()] == ["http://a"] and m.due()
    offered = []

    def bring_back(back):
        offered.append([c.endpoint for c in back])
        return [c for c in back if c.endpoint == "http://new"]  # b fails its catch-up

    m.recover(bring_back)
    assert offered == [["http://b", "http://new"]]
    assert gone.closed and "http://gone" not in [c.endpoint for c in m.clients]
    assert [c.endpoint for c in m.live()] == ["http://a", "http://new"] and m.rejoined == 1
    assert "http://b" in m.down and not m.due()  # looked for again only after recheck_s


def test_with_every_replica_down_and_none_back_the_wait_names_why():
    a = Server("http://a", healthy=False)
    m = Membership([a], lambda e: Server(e), lambda: ["http://a"], recheck_s=0.0, rejoin_wait_s=0.0)
    m.lose(a, "connection refused")
    with pytest.raises(RingzeroError, match="every replica is down .*http://a: connection refused"):
        m.live_or_wait(lambda back: back)
