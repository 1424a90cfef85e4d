"""``ReplicaSet``: sampling spread over several SGLang replicas, weight pushes reaching every one of them.

The replicas are small fake SGLang servers (``http.server`` in threads) that answer SGLang's bodies and
record every call. For distributed pushes each fake replica runs in its own process (``python this_file
serve``) and joins the weight group the way SGLang's servers do (``init_custom_process_group``: a tcp
rendezvous, a ``PrefixStore`` named after the group, torch's ``_new_process_group_helper``), then receives
the broadcast tensors.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import torch

from ringzero.rollout.clients.http_client import HttpRolloutClient

ORDER: list[tuple[str, str]] = []  # (replica name, path) of every control call, across replicas
ORDER_LOCK = threading.Lock()


class FakeSGLang:
    """One SGLang replica: ``/generate`` reports ``weight_version``; weight pushes change it (unless
    ``sticky``)."""

    def __init__(
        self,
        name: str,
        *,
        sessions: bool = True,
        refuse: str | None = None,
        sticky: bool = False,
        spans: bool = False,
        pause: bool = True,
        port: int = 0,
        delay_s: float = 0.0,
    ):
        self.name, self.sessions, self.refuse, self.sticky, self.spans, self.pause = (
            name,
            sessions,
            refuse,
            sticky,
            spans,
            pause,
        )
        self.delay_s = delay_s  # each /generate takes this long (a kill can land mid-request)
        self.version = "default"
        self.claimed = "default"  # what /model_info reports: the last version pushed, even when sticky
        self.calls: list[tuple[str, dict]] = []
        self.generated: list[list[list[int]]] = []
        self.group = None
        self.received: dict[str, torch.Tensor] = {}
        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def body(self, path: str) -> dict:
        return next(b for p, b in self.calls if p == path)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/model_info":
                    self._send(200, {"model_path": "/models/policy", "weight_version": fake.claimed})
                elif self.path == "/calls":
                    self._send(200, fake.paths())
                elif self.path == "/received":
                    self._send(
                        200,
                        {k: [str(v.dtype), v.float().flatten().tolist()] for k, v in fake.received.items()},
                    )
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.calls.append((self.path, body))
                with ORDER_LOCK:
                    ORDER.append((fake.name, self.path))
                code, payload = fake.answer(self.path, body)
                self._send(code, payload)

        return Handler

    def answer(self, path: str, body: dict):
        ok = {"success": True, "message": "Succeeded."}
        if path == "/generate":
            return 200, self.generate(body)
        if path in ("/pause_generation", "/continue_generation"):
            if not self.pause:
                return 404, {"detail": "Not Found"}
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path in ("/begin_weight_update", "/end_weight_update"):
            return (200, ok) if self.sessions else (404, {"detail": "Not Found"})
        if self.refuse == path:
            return 400, {"success": False, "message": f"{self.name} cannot load that"}
        if path == "/update_weights_from_disk":
            self.version = self.version if self.sticky else body["weight_version"]
            self.claimed = body["weight_version"]
            return 200, {**ok, "num_paused_requests": 0}
        if path == "/init_weights_update_group":
            self.group = join_group(body)
            return 200, {"success": True, "message": "Succeeded to initialize custom process group."}
        if path == "/update_weights_from_distributed":
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                torch.distributed.broadcast(t, src=0, group=self.group)
                self.received[name] = t
            self.version = self.claimed = body["weight_version"]
            return 200, ok
        return 404, {"detail": "Not Found"}

    def generate(self, body: dict) -> list[dict]:
        import time

        time.sleep(self.delay_s)
        prompts, params = body["input_ids"], body["sampling_params"]
        self.generated.append(prompts)
        out = []
        for prompt, p in zip(prompts, params, strict=True):
            for j in range(p["n"]):
                ids = [(sum(prompt) + j + k) % 50 for k in range(p["max_new_tokens"])]
                meta = {
                    "id": f"{self.name}-{len(out)}",
                    "finish_reason": {"type": "length", "length": len(ids)},
                    "prompt_tokens": len(prompt),
                    "weight_version": self.version,
                    "num_retractions": 0,
                    "completion_tokens": len(ids),
                    "cached_tokens": 0,
                    "output_token_logprobs": [[-0.5, t, None] for t in ids],
                }
                if self.spans:
                    meta["weight_versions"] = [
                        {"version": "older", "start": 0, "end": 1},
                        {"version": self.version, "start": 1, "end": len(ids)},
                    ]
                out.append({"text": "", "output_ids": ids, "meta_info": meta})
        return out


def join_group(body: dict):
    """The server's side of ``/init_weights_update_group``, as SGLang builds it (one TP rank per fake)."""
    from datetime import timedelta

    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = timedelta(seconds=60)
    url = f"tcp://{body['master_address']}:{body['master_port']}"
    store, rank, world = next(rendezvous(url, body["rank_offset"], body["world_size"], timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(body["group_name"], store)
    pg, _ = _new_process_group_helper(
        world, rank, [], Backend(body["backend"]), store, group_name=body["group_name"], timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


@pytest.fixture
def fakes(request):
    made = []

    def make(n: int = 3, **kwargs):
        for _ in range(n):
            made.append(FakeSGLang(f"r{len(made)}", **kwargs))
        return made[-n:]

    ORDER.clear()
    yield make
    for f in made:
        f.close()


def replica_set(fakes_, **kwargs):
    from ringzero.rollout.replicas.replica_set import ReplicaSet

    return ReplicaSet([f.url for f in fakes_], connect=HttpRolloutClient, retries=0, **kwargs)


def reqs(n_prompts: int, n: int = 2, max_new: int = 3):
    from ringzero.rollout.types import GenerateRequest, SamplingParams

    return [
        GenerateRequest([i + 1, i + 2], SamplingParams(max_new_tokens=max_new, n=n)) for i in range(n_prompts)
    ]


# --- sampling ---


def test_generate_spreads_requests_over_replicas_and_keeps_their_order(fakes):
    replicas = fakes(2)
    client = replica_set(replicas)
    out = client.generate(reqs(4))
    assert [len(f.generated[0]) for f in replicas] == [2, 2]  # each replica got a contiguous half
    assert replicas[0].generated[0] == [[1, 2], [2, 3]] and replicas[1].generated[0] == [[3, 4], [4, 5]]
    for i, group in enumerate(out):
        assert len(group) == 2 and all(c.prompt_ids == [i + 1, i + 2] for c in group)
        assert [c.output_ids[0] for c in group] == [(2 * i + 3) % 50, (2 * i + 4) % 50]
    assert (
        client.generate(reqs(1)) and sum(len(f.generated) for f in replicas) == 3
    )  # one request, one replica


# --- weight pushes ---


def test_a_disk_push_reaches_every_replica_between_pause_and_continue(fakes):
    replicas = fakes(3, sessions=False)
    client = replica_set(replicas, weights_dir="/shared-weights/launch")
    client.update_weights_from_disk("/shared-weights/launch/step-1", "step-1")
    for f in replicas:
        assert f.paths() == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        assert f.body("/pause_generation") == {"mode": "abort"}
        assert f.body("/update_weights_from_disk") == {
            "model_path": "/shared-weights/launch/step-1",
            "weight_version": "step-1",
            "flush_cache": True,
            "abort_all_requests": False,
        }
        assert f.version == "step-1"
    paths = [p for _, p in ORDER]
    assert paths.index("/update_weights_from_disk") > max(
        i for i, p in enumerate(paths) if p == "/pause_generation"
    )
    assert min(i for i, p in enumerate(paths) if p == "/continue_generation") > max(
        i for i, p in enumerate(paths) if p == "/update_weights_from_disk"
    )
    assert all(c.weight_version == "step-1" for g in client.generate(reqs(3)) for c in g)


def test_a_replica_that_refuses_fails_the_push_by_name_and_every_replica_continues(fakes):
    from ringzero.errors import RingzeroError

    good, bad, other = fakes(1)[0], fakes(1, refuse="/update_weights_from_disk")[0], fakes(1)[0]
    client = replica_set([good, bad, other])
    with pytest.raises(
        RingzeroError,
        match=rf"rollout replica {bad.url} refused the weight push 'step-2'.*"
        "r1 cannot load that",
    ):
        client.update_weights_from_disk("/w/step-2", "step-2")
    for f in (good, bad, other):
        assert f.paths()[-1] == "/continue_generation"
    assert client.weight_version is None  # a failed push is not a pushed version


def test_a_store_uri_is_never_sent_to_sglang(fakes):
    from ringzero.errors import RingzeroError

    replicas = fakes(2)
    client = replica_set(replicas, weights_dir="/shared-weights/x")
    for bad, why in [
        ("s3://ringzero/runs/r/weights-step-1", "store URI"),
        ("file:///tmp/w", "store URI"),
        ("relative/path", "absolute path"),
        ("/elsewhere/step-1", "not under engines.rollout.weights_dir"),
    ]:
        with pytest.raises(RingzeroError, match=why):
            client.update_weights_from_disk(bad, "v")
    assert all(f.calls == [] for f in replicas)
    # ``weight_sync: store`` (ringzero serve reads its store) lets the URI through.
    replica_set(replicas, accept_store_uris=True).update_weights_from_disk("s3://b/ckpt", "v1")
    assert all(f.body("/update_weights_from_disk")["model_path"] == "s3://b/ckpt" for f in replicas)


def test_servers_without_pause_still_get_the_update(fakes):
    replicas = fakes(2, pause=False)
    replica_set(replicas).update_weights_from_disk("/w/a", "a")
    assert all(
        f.paths() == ["/pause_generation", "/update_weights_from_disk"] and f.version == "a" for f in replicas
    )


# --- weight_version checks ---


def test_a_stale_weight_version_is_refused_naming_the_replica(fakes):
    from ringzero.errors import RingzeroError

    fresh, stuck = fakes(1)[0], fakes(1, sticky=True)[0]
    client = replica_set([fresh, stuck])
    client.generate(reqs(2))  # before any push nothing is checked
    client.update_weights_from_disk("/w/step-5", "step-5")
    with pytest.raises(
        RingzeroError,
        match=rf"replica {stuck.url}: 4 of 4 samples carry weight_version "
        r"\['default'\], but the last push was 'step-5'",
    ):
        client.generate(reqs(4))


def test_stale_samples_can_be_counted_instead(fakes):
    fresh, stuck = fakes(1)[0], fakes(1, sticky=True)[0]
    client = replica_set([fresh, stuck], stale="count")
    client.update_weights_from_disk("/w/step-1", "step-1")
    out = client.generate(reqs(4))
    assert [c.weight_version for g in out for c in g] == ["step-1"] * 4 + ["default"] * 4
    assert client.pop_metrics() == {"rollout/stale_samples": 4.0}
    assert client.pop_metrics() == {"rollout/stale_samples": 0.0} and client.stale_total == 4


def test_a_sample_spanning_two_versions_is_stale(fakes):
    client = replica_set(fakes(1, spans=True), stale="count")
    client.update_weights_from_disk("/w/new", "new")
    out = client.generate(reqs(1, n=3))
    assert all(c.weight_version == "new" for c in out[0])  # the last span's version...
    assert client.pop_metrics()["rollout/stale_samples"] == 3.0  # ...but the first token came from "older"


# --- where the replicas are ---


def test_endpoints_come_from_the_environment_the_list_dns_or_the_endpoint():
    from ringzero.config.run import RolloutEngine
    from ringzero.errors import RingzeroError
    from ringzero.rollout.replicas.endpoints import resolve_endpoints

    engine = RolloutEngine(
        kind="sglang", endpoint="http://svc:30000", replica_dns="r-pods.ml.svc:30000", replicas=2
    )
    env = {"RINGZERO_ROLLOUT_ENDPOINTS": "http://a:1, http://b:2"}
    assert resolve_endpoints(engine, env) == ["http://a:1", "http://b:2"]
    with pytest.raises(RingzeroError, match="must start with http"):
        resolve_endpoints(engine, {"RINGZERO_ROLLOUT_ENDPOINTS": "a:1"})
    assert resolve_endpoints(RolloutEngine(kind="sglang", endpoints=["http://x:1"]), {}) == ["http://x:1"]
    assert resolve_endpoints(RolloutEngine(kind="sglang", endpoint="http://svc:30000"), {}) == [
        "http://svc:30000"
    ]

    answers = [[], ["10.0.0.7"], ["10.0.0.7", "10.0.0.3", "10.0.0.7"]]
    asked = []

    def resolver(host, port, type):
        asked.append((host, port, type))
        return [(socket.AF_INET, type, 6, "", (ip, port)) for ip in answers[min(len(asked) - 1, 2)]]

    got = resolve_endpoints(engine, {}, resolver=resolver, sleep=lambda s: None)
    assert got == ["http://10.0.0.3:30000", "http://10.0.0.7:30000"]  # waited until both pods were ready
    assert asked[0] == ("r-pods.ml.svc", 30000, socket.SOCK_STREAM) and len(asked) == 3

    clock = iter(range(0, 10_000, 100))
    with pytest.raises(RingzeroError, match=r"resolves to 1 address\(es\).*2 expected"):
        resolve_endpoints(
            engine.model_copy(update={"timeout_s": 300}),
            {},
            resolver=lambda h, p, type: [(0, type, 0, "", ("10.0.0.1", p))],
            sleep=lambda s: None,
            clock=lambda: next(clock),
        )


# --- the factory and the spread over ranks ---


def load_tiny(*overrides: str):
    from ringzero.config import load_config

    root = Path(__file__).resolve().parents[2]
    return load_config(root / "configs" / "tiny-cpu.yaml", list(overrides))


def test_the_factory_builds_todays_embedded_engine(monkeypatch):
    import ringzero.rollout.engine.embedded as engine_module
    from ringzero.rollout.deployment.connect import rollout_client

    made = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            made.append((args, kwargs))

    monkeypatch.setattr(engine_module, "EmbeddedEngine", Recorder)
    cfg = load_tiny()
    client = rollout_client(cfg, "MODEL", "TOK", seed=5, max_batch=7, deterministic=True)
    assert isinstance(client, Recorder)
    assert made == [
        (("MODEL", "TOK", cfg.precision.rollout), {"deterministic": True, "max_batch": 7, "seed": 5})
    ]
    sglang = load_tiny("engines.rollout.kind=sglang", "engines.rollout.endpoint=http://x:1")
    assert isinstance(rollout_client(sglang, "M", "T", seed=0, max_batch=1, local=True), Recorder)


def test_the_factory_builds_one_replica_set_per_server_set_and_serves_the_stage_checkpoint(fakes):
    from ringzero.errors import RingzeroError
    from ringzero.rollout.deployment.connect import close_remote_clients, rollout_client
    from ringzero.rollout.replicas.replica_set import ReplicaSet

    replicas = fakes(2)
    urls = ",".join(f.url for f in replicas)
    base = [
        "engines.rollout.kind=sglang",
        f"engines.rollout.endpoints=[{urls}]",
        "engines.rollout.served_uri=s3://b/start",
    ]
    try:
        cfg = load_tiny(*base)
        first = rollout_client(cfg, None, None, seed=0, max_batch=1, serves="s3://b/start")
        assert isinstance(first, ReplicaSet) and first.endpoints == [f.url for f in replicas]
        assert all(f.calls == [] for f in replicas)  # the servers started with that checkpoint
        assert rollout_client(cfg, None, None, seed=0, max_batch=1) is first
        with pytest.raises(RingzeroError, match="weight_sync disk needs engines.rollout.weights_dir"):
            rollout_client(cfg, None, None, seed=0, max_batch=1, serves="s3://b/other")
        store = load_tiny(*base, "engines.rollout.weight_sync=store")
        rollout_client(store, None, None, seed=0, max_batch=1, serves="s3://b/other")
        assert all(f.body("/update_weights_from_disk")["model_path"] == "s3://b/other" for f in replicas)
        again = rollout_client(store, None, None, seed=0, max_batch=1, serves="s3://b/other")
        assert all(f.paths().count("/update_weights_from_disk") == 1 for f in replicas)  # already served
        assert again.weight_version == "s3://b/other"
    finally:
        close_remote_clients()


class FakeRuntime:
    def __init__(self, rank: int, world: int = 2):
        self.rank, self.world = rank, world
        self.distributed, self.is_main = True, rank == 0
        self.barriers = 0

    def barrier(self):
        self.barriers += 1

    def world_slice(self, n: int) -> slice:
        per = -(-n // self.world)
        return slice(self.rank * per, min(n, (self.rank + 1) * per))

    def all_gather(self, obj):
        return [obj, obj]


def test_spread_pushes_once_from_rank_zero_and_the_others_expect_the_version(fakes):
    from ringzero.rollout.clients.spread import spread

    replicas = fakes(2)
    main, other = spread(replica_set(replicas), FakeRuntime(0)), spread(replica_set(replicas), FakeRuntime(1))
    assert not hasattr(main, "update_weights")  # disk replica sets have no in-process transport
    other.update_weights_from_disk("/w/s1", "s1")
    assert all(f.calls == [] for f in replicas) and other.client.weight_version == "s1"
    main.update_weights_from_disk("/w/s1", "s1")
    assert all(f.paths().count("/update_weights_from_disk") == 1 for f in replicas)
    assert main.pop_metrics() == {"rollout/stale_samples": 0.0}


# --- distributed pushes, against replicas in their own processes ---


class ReplicaProcess:
    def __init__(self, sessions: bool, port: int = 0, delay_s: float = 0.0):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", "1" if sessions else "0", str(port), str(delay_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self.proc.stdout.readline().strip()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def received(self) -> dict:
        return requests.get(self.url + "/received", timeout=30).json()

    def calls(self) -> list[str]:
        return requests.get(self.url + "/calls", timeout=30).json()

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def test_distributed_pushes_reach_every_replica_through_the_weight_group():
    from ringzero.rollout.clients.spread import spread
    from ringzero.rollout.replicas.distributed_set import DistributedReplicaSet

    procs = [ReplicaProcess(sessions=True), ReplicaProcess(sessions=False)]
    try:
        assert all(p.url.startswith("http://") for p in procs)
        client = DistributedReplicaSet(
            connect=HttpRolloutClient,
            endpoints=[p.url for p in procs],
            retries=0,
            backend="gloo",
            master_address="127.0.0.1",
            sync_timeout_s=60,
        )
        assert hasattr(spread(client, FakeRuntime(0)), "update_weights")
        gen = torch.Generator().manual_seed(0)
        state = {
            "word_embeddings.weight": torch.randn(5, 3, generator=gen),
            "lm_head.weight": torch.randn(2, 3, generator=gen).to(torch.bfloat16),
        }
        client.update_weights(state, "step-1")
        sent = {
            "model.word_embeddings.weight": state["word_embeddings.weight"],
            "lm_head.weight": state["lm_head.weight"],
        }
        for p in procs:
            got = p.received()
            assert list(got) == list(sent)  # the state dict goes out under the checkpoint's tensor names
            assert got["lm_head.weight"][0] == "torch.bfloat16"
            for name, t in sent.items():
                assert got[name][1] == t.float().flatten().tolist()
        state2 = {k: v + 1 for k, v in state.items()}
        client.update_weights(state2, "step-2")  # the group is opened once
        assert all(
            p.received()["model.word_embeddings.weight"][1]
            == state2["word_embeddings.weight"].flatten().tolist()
            for p in procs
        )
        assert all(c.weight_version == "step-2" for g in client.generate(reqs(2)) for c in g)
    finally:
        for p in procs:
            p.close()


class StuckGroup:
    """A weight group whose broadcasts never complete (the receiving side went away)."""

    class Work:
        def is_completed(self):
            return False

    def broadcast(self, tensors):
        return [self.Work() for _ in tensors]


def test_a_replica_refusing_a_distributed_push_fails_it_at_once_and_the_next_push_opens_a_new_group(fakes):
    from ringzero.errors import RingzeroError
    from ringzero.rollout.replicas.distributed_set import DistributedReplicaSet

    good, bad = fakes(1)[0], fakes(1, refuse="/update_weights_from_distributed")[0]
    client = DistributedReplicaSet(
        connect=HttpRolloutClient, endpoints=[good.url, bad.url], retries=0, backend="gloo", sync_timeout_s=5
    )
    opened = []

    def open_group(clients):
        opened.append([c.endpoint for c in clients])
        return StuckGroup()

    client._open_group = open_group
    good.answer = lambda path, body: (200, {"success": True, "message": ""})  # answers without receiving
    with pytest.raises(
        RingzeroError, match=rf"{bad.url} refused the weight push 'step-1'.*r1 cannot load that"
    ):
        client.update_weights({"w": torch.zeros(2)}, "step-1")
    assert bad.paths()[-1] == "/continue_generation"
    assert client.broken and client.weight_version is None
    with pytest.raises(RingzeroError, match="refused the weight push 'step-2'"):
        client.update_weights({"w": torch.zeros(2)}, "step-2")
    # the broken group is left and a new one opened under a new name with the same members
    assert opened == [[good.url, bad.url]] * 2 and client.current_group == "ringzero-weights-2"
    assert bad.body("/destroy_weights_update_group") == {"group_name": "ringzero-weights"}


def test_distributed_bodies_name_the_group_and_each_replicas_ranks():
    from ringzero.rollout.replicas.weight_group import init_group_body, rank_offsets

    offsets = rank_offsets(3, 4)
    assert offsets == [1, 5, 9]
    assert init_group_body("10.0.0.5", 29600, offsets[2], 13, "ringzero-weights", "nccl") == {
        "master_address": "10.0.0.5",
        "master_port": 29600,
        "rank_offset": 9,
        "world_size": 13,
        "group_name": "ringzero-weights",
        "backend": "nccl",
    }


def serve_replica(sessions: bool, port: int, delay_s: float) -> None:
    fake = FakeSGLang("proc", sessions=sessions, port=port, delay_s=delay_s)
    print(fake.url, flush=True)
    fake.thread.join()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve_replica(sys.argv[2] == "1", int(sys.argv[3]), float(sys.argv[4]))


# --- a lost replica ---


def _wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not come back")


def _kill_during_generate(replica: ReplicaProcess, after_s: float):
    """Kill ``replica`` once its /generate is in flight (``after_s`` into the call), in a thread."""
    import time

    def kill():
        deadline = time.monotonic() + 30
        while "/generate" not in replica.calls() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after_s)
        replica.proc.kill()
        replica.proc.wait(timeout=30)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_a_replica_killed_mid_rollout_loses_no_sample_and_rejoins_on_the_current_weights():
    """Two replica processes; one is killed while its share is being sampled and restarted at the same
    address with its starting weights. The share is sampled again on the live replica, every sample
    carries the pushed version, and the restarted replica is given the last push and checked before it
    serves again."""
    from ringzero.rollout.replicas.replica_set import ReplicaSet

    a, b = ReplicaProcess(sessions=True, delay_s=0.5), ReplicaProcess(sessions=True, delay_s=0.5)
    restarted = None
    try:
        client = ReplicaSet([a.url, b.url], connect=HttpRolloutClient, retries=0, timeout_s=20, recheck_s=0.0)
        client.update_weights_from_disk("/w/step-1", "step-1")
        killer = _kill_during_generate(b, after_s=0.1)
        out = client.generate(reqs(8))
        killer.join()
        assert len(out) == 8 and all(c.weight_version == "step-1" for g in out for c in g)
        assert list(client.down) == [b.url]
        restarted = ReplicaProcess(sessions=True, port=b.port)  # same address, starting weights
        _wait_healthy(restarted.url)
        out = client.generate(reqs(8))
        assert all(c.weight_version == "step-1" for g in out for c in g)
        assert client.down == {} and client.rejoined == 1
        calls = restarted.calls()
        # caught up (paused, loaded the last folder, continued) before it sampled
        assert calls[:3] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        assert "/generate" in calls[3:]
        client.update_weights_from_disk("/w/step-2", "step-2")  # later pushes reach it as before
        assert all(c.weight_version == "step-2" for g in client.generate(reqs(4)) for c in g)
    finally:
        for p in (a, b, restarted):
            if p is not None:
                p.close()


def test_a_restarted_replica_that_failed_no_request_is_caught_up_when_its_samples_give_it_away(fakes):
    """A replica restarted between calls answers with its starting weights: its share is dropped, it is
    caught up, and nothing stale reaches the caller."""
    from ringzero.rollout.replicas.replica_set import ReplicaSet

    a, b = fakes(2)
    client = replica_set([a, b])
    client.update_weights_from_disk("/w/step-3", "step-3")
    b.version = b.claimed = "default"  # what a restart leaves
    out = client.generate(reqs(6))
    assert all(c.weight_version == "step-3" for g in out for c in g)
    assert client.rejoined == 1 and b.paths().count("/update_weights_from_disk") == 2
    assert isinstance(client, ReplicaSet) and client.down == {}


def test_a_push_skips_a_dead_replica_and_no_replica_left_is_an_error(fakes):
    from ringzero.errors import RingzeroError

    a, b = fakes(2)
    client = replica_set([a, b], rejoin_wait_s=0.0)
    assert client.generate([]) == []
    b.close()
    client.update_weights_from_disk("/w/step-1", "step-1")
    assert list(client.down) == [b.url] and a.paths().count("/update_weights_from_disk") == 1
    a.close()
    with pytest.raises(RingzeroError, match="every replica is down"):
        client.generate(reqs(2))


def test_a_distributed_group_is_rebuilt_when_a_killed_member_returns():
    """The weight group cannot go on without a member: when the killed replica is back, a new group (new
    name and port) is opened with every live replica and the last tensors are sent again."""
    from ringzero.rollout.replicas.distributed_set import DistributedReplicaSet

    a, b = ReplicaProcess(sessions=True), ReplicaProcess(sessions=False)
    restarted = None
    try:
        client = DistributedReplicaSet(
            connect=HttpRolloutClient,
            endpoints=[a.url, b.url],
            retries=0,
            timeout_s=20,
            backend="gloo",
            master_address="127.0.0.1",
            sync_timeout_s=60,
        )
        state = {"word_embeddings.weight": torch.arange(6.0).reshape(2, 3)}
        client.update_weights(state, "step-1")
        b.close()
        restarted = ReplicaProcess(sessions=False, port=b.port)
        _wait_healthy(restarted.url)
        # b answers with its starting weights: its share is sampled again on a, and b rejoins via a new group
        out = client.generate(reqs(6))
        assert all(c.weight_version == "step-1" for g in out for c in g)
        assert client.down == {} and client.current_group == "ringzero-weights-2"
        assert restarted.received()["model.word_embeddings.weight"][1] == list(range(6))
        client.update_weights({"word_embeddings.weight": torch.ones(2, 3)}, "step-2")
        assert all(p.received()["model.word_embeddings.weight"][1] == [1.0] * 6 for p in (a, restarted))
    finally:
        for p in (a, b, restarted):
            if p is not None:
                p.close()
