"""Ring chaos: hundreds of rounds of producers and consumers killed at random moments.

Each round builds a fresh ring from a pool of long-lived worker processes (random counts
of producers and consumers, random slot counts, random item counts and sizes), starts
them, and SIGKILLs one member at a random moment: once the members have reported a random number
of the round's items published or taken (a few rounds kill nobody). The killed
worker is replaced by a new process for the next round. After every round:

- no item was delivered twice, and every delivered item carries its exact pattern;
- every item delivered was published (the victim may have died between publishing an
  item and reporting it, so one unreported item of a killed producer is allowed);
- every survivor either finished normally or raised PeerDied whose message names the
  killed rank (directly, or as the last error of a peer that aborted because of it);
  nobody hangs or fails otherwise;
- in a round without a kill, every published item was delivered exactly once;
- /dev/shm holds no name of the round's ring.

Workers come from a forkserver that has torch and the ring imported, so a restart costs
milliseconds rather than a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ringtrain.batch import slot_fields
from ringtrain.ring import CONSUMER, PRODUCER, PeerDied, Ring, RingSpec
from ringtrain.ring.names import remove_run
from tests.helpers import ring_workers as rw

ROUNDS = 200
POOL = 4
WAIT_TIMEOUT_S = 0.03
# A round's survivors must all report within this (PeerDied comes within a few waits).
ROUND_DEADLINE_S = 10.0
NO_KILL_FRACTION = 0.1
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["torch", "ring_workers", "ringtrain.ring"])


# ---- worker side ------------------------------------------------------------------------------


def _produce(ring: Ring, conn: mpc.Connection, items: int, seed: int) -> None:
    rng = random.Random(seed)
    producer = ring.producer()
    me = ring.spec.producers.index(ring.local_index)
    cpu = torch.device("cpu")
    for seq in range(items):
        n = rng.randint(1, rw.MAX_TOKENS)
        slot = producer.acquire()
        rw.write_item(slot, me, seq, n, cpu)
        producer.publish(slot, n, 1, {"producer": me, "seq": seq})
        conn.send(("published", me, seq))
    producer.finish()


def _consume(ring: Ring, conn: mpc.Connection) -> None:
    consumer = ring.consumer()
    while (item := consumer.take()) is not None:
        conn.send(("took", item.meta["producer"], item.meta["seq"], rw.item_ok(item)))


def chaos_worker(conn: mpc.Connection) -> None:
    """Serve rounds until told to exit: join a ring, run a job, report how it ended."""
    ring: Ring | None = None
    while True:
        command, *args = conn.recv()
        if command == "exit":
            return
        if command == "create":
            spec, index = args
            ring = Ring.create(spec, index, "cpu")
            conn.send(("joined",))
        elif command == "attach":
            run_id, index = args
            ring = Ring.attach(run_id, index, "cpu")
            conn.send(("joined",))
        elif command == "go":
            assert ring is not None
            job, job_args = args
            ring.unlink()
            try:
                if job == "produce":
                    _produce(ring, conn, *job_args)
                else:
                    _consume(ring, conn)
            except PeerDied as exc:
                # As a trainer rank does: record why, then abort the ring for the others.
                ring.fail(str(exc))
                conn.send(("done", "peer_died", str(exc)))
            except Exception as exc:
                ring.close(clean=False)
                conn.send(("done", "error", f"{type(exc).__name__}: {exc}"))
            else:
                ring.close(clean=True)
                conn.send(("done", "ok", ""))
            ring = None


# ---- coordinator side ---------------------------------------------------------------------------


@dataclass
class Worker:
    """One pooled worker process and our end of its pipe."""

    proc: Any
    conn: mpc.Connection

    @classmethod
    def start(cls) -> Worker:
        ours, theirs = CTX.Pipe()
        proc = CTX.Process(target=chaos_worker, args=(theirs,), daemon=True)
        proc.start()
        theirs.close()
        return cls(proc, ours)

    def request(self, *message: Any) -> Any:
        self.conn.send(message)
        if not self.conn.poll(ROUND_DEADLINE_S):
            raise AssertionError(f"worker {self.proc.pid} did not answer {message[0]!r}")
        return self.conn.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(ROUND_DEADLINE_S)
        self.conn.close()


@dataclass
class RoundLog:
    """What the members of one round reported."""

    published: set[tuple[int, int]] = field(default_factory=set)
    taken: list[tuple[int, int]] = field(default_factory=list)
    corrupted: int = 0
    outcomes: dict[int, tuple[str, str]] = field(default_factory=dict)


def _make_spec(run_id: str, producers: int, consumers: int, slots: int) -> RingSpec:
    return RingSpec(
        run_id=run_id,
        generation=0,
        ends=[PRODUCER] * producers + [CONSUMER] * consumers,
        labels=["target"] * producers + ["drafter"] * consumers,
        global_ranks=[10 + i for i in range(producers + consumers)],
        slots_per_producer=slots,
        max_tokens=rw.MAX_TOKENS,
        max_docs=4,
        fields=slot_fields(1, rw.WIDTH, "float32"),
        transport="host",
        wait_timeout_s=WAIT_TIMEOUT_S,
        heartbeat_timeout_s=30.0,
    )


def _collect(
    members: dict[int, Worker], log: RoundLog, victim: int | None, kill_after: int
) -> None:
    """Read reports until every survivor said it is done and the victim's pipe is closed.

    The victim is killed once `kill_after` items were reported published or taken (or
    when the survivors are done, if they finish first); what it sent before dying is
    read up to the end of its pipe."""
    waiting = {index for index in members if index != victim}
    open_conns = {members[i].conn: i for i in members}
    deadline = time.monotonic() + ROUND_DEADLINE_S
    killed = victim is None
    while waiting or (victim is not None and members[victim].conn in open_conns):
        if not killed and (not waiting or len(log.published) + len(log.taken) >= kill_after):
            os.kill(members[victim].proc.pid, signal.SIGKILL)
            killed = True
        timeout = deadline - time.monotonic()
        assert timeout > 0, f"members {sorted(waiting)} hang (victim {victim})"
        for conn in mpc.wait(list(open_conns), timeout):
            index = open_conns[conn]
            try:
                message = conn.recv()
            except (EOFError, ConnectionResetError):
                assert index == victim, f"member {index} died unasked"
                del open_conns[conn]
                continue
            kind = message[0]
            if kind == "published":
                log.published.add((message[1], message[2]))
            elif kind == "took":
                log.taken.append((message[1], message[2]))
                log.corrupted += not message[3]
            else:
                log.outcomes[index] = (message[1], message[2])
                waiting.discard(index)
                if index != victim:
                    del open_conns[conn]  # idle until the next round


def _check_round(
    log: RoundLog, spec: RingSpec, victim: int | None, victim_pid: int | None, where: str
) -> None:
    duplicates = [item for item, n in Counter(log.taken).items() if n > 1]
    assert not duplicates, f"{where}: delivered twice: {duplicates}"
    assert log.corrupted == 0, f"{where}: {log.corrupted} corrupted items"
    unknown = set(log.taken) - log.published
    if victim is not None and spec.ends[victim] == PRODUCER:
        me = spec.producers.index(victim)
        last = max((s for p, s in log.published if p == me), default=-1)
        unknown -= {(me, last + 1)}
    assert not unknown, f"{where}: delivered but never published: {sorted(unknown)}"
    for index, (outcome, message) in log.outcomes.items():
        if index == victim:
            continue
        assert outcome in ("ok", "peer_died"), f"{where}: member {index} failed: {message}"
        if outcome == "peer_died":
            named = f"rank {spec.global_ranks[victim]} ({spec.label(victim)}, pid {victim_pid})"
            assert named in message, f"{where}: member {index}: {message!r} does not name {named}"
    if victim is None:
        assert all(o == "ok" for o, _ in log.outcomes.values()), f"{where}: {log.outcomes}"
        assert sorted(log.taken) == sorted(log.published), f"{where}: items lost"


def _shm_names(run_id: str) -> list[str]:
    return [e for e in os.listdir("/dev/shm") if f"ringtrain.{run_id}." in e]


def test_random_kills_and_restarts_keep_the_ring_invariants() -> None:
    seed = int(os.environ.get("RINGTRAIN_CHAOS_SEED", "20261129"))
    rng = random.Random(seed)
    pool = [Worker.start() for _ in range(POOL)]
    run_ids: list[str] = []
    outcomes: Counter[str] = Counter()
    try:
        for round_no in range(ROUNDS):
            run_id = f"chaos{os.getpid()}r{round_no}"
            run_ids.append(run_id)
            producers, consumers = rng.randint(1, 2), rng.randint(1, 2)
            spec = _make_spec(run_id, producers, consumers, slots=rng.randint(1, 3))
            chosen = rng.sample(range(POOL), producers + consumers)
            members = {index: pool[w] for index, w in enumerate(chosen)}
            assert members[0].request("create", spec, 0) == ("joined",)
            for index in range(1, spec.num_ranks):
                assert members[index].request("attach", run_id, index) == ("joined",)
            victim = None if rng.random() < NO_KILL_FRACTION else rng.randrange(spec.num_ranks)
            victim_pid = None if victim is None else members[victim].proc.pid
            items = [rng.randint(5, 40) for _ in range(producers)]
            # Each item is reported twice (published, taken): kill anywhere in the stream.
            kill_after = rng.randint(0, 2 * sum(items))
            for index, worker in members.items():
                if spec.ends[index] == PRODUCER:
                    job = ("produce", (items[index], rng.randrange(1 << 30)))
                    worker.conn.send(("go", *job))
                else:
                    worker.conn.send(("go", "consume", ()))
            log = RoundLog()
            where = f"round {round_no} (seed {seed}, victim {victim}, ends {spec.ends})"
            _collect(members, log, victim, kill_after)
            _check_round(log, spec, victim, victim_pid, where)
            outcomes.update(o for i, (o, _) in log.outcomes.items() if i != victim)
            if victim is not None:
                worker_slot = chosen[victim]
                pool[worker_slot].stop()
                pool[worker_slot] = Worker.start()
            assert _shm_names(run_id) == [], f"{where}: leaked {_shm_names(run_id)}"
    finally:
        for worker in pool:
            if worker.proc.is_alive():
                worker.conn.send(("exit",))
            worker.stop()
        for run_id in run_ids:
            remove_run(run_id, "/dev/shm")
    # The rounds really exercised both ways a survivor may end.
    assert outcomes["peer_died"] > ROUNDS // 4 and outcomes["ok"] > ROUNDS // 10, outcomes
