"""The ring's transports: which one a ring gets (the config's, or auto's choice from where
the ranks run and which GPUs reach each other), the code the control block keeps for it,
and a CPU ring whose slots are the host transport's shared segment."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
import torch

from ringtrain.ring import RingError
from ringtrain.ring.host_payload import HostPayload
from ringtrain.ring.names import data_name
from ringtrain.ring.payload import (
    AUTO,
    TRANSPORTS,
    resolve_transport,
    transport_code,
    transport_name,
)
from ringtrain.ring.spec import SlotLayout
from tests.helpers import ring_workers as rw

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def cuda_machine(
    monkeypatch: pytest.MonkeyPatch,
    gpus: int,
    no_peer_access: Sequence[tuple[int, int]] = (),
) -> None:
    """What torch reports on a machine of `gpus` GPUs where each pair (a, b) of
    `no_peer_access` cannot reach the other (like CUDA, a GPU is no peer of itself)."""
    missing = {frozenset(pair) for pair in no_peer_access}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(
        torch.cuda, "can_device_access_peer", lambda a, b: a != b and {a, b} not in missing
    )


def test_each_transport_has_a_code_the_control_block_reads_back() -> None:
    codes = [transport_code(name) for name in TRANSPORTS]
    assert sorted(codes) == list(range(len(TRANSPORTS)))
    assert [transport_name(code) for code in codes] == list(TRANSPORTS)


def test_an_unknown_transport_is_refused_naming_the_choices() -> None:
    with pytest.raises(
        RingError, match=r"'gpu' is unknown: use one of \['auto', 'host', 'device'\]"
    ):
        resolve_transport("gpu", CPU)


def test_ranks_on_the_cpu_get_the_host_transport_and_are_refused_the_device_one() -> None:
    assert resolve_transport("host", CPU) == ("host", "requested in the config")
    assert resolve_transport(AUTO, CPU) == ("host", "auto: ranks run on cpu, not on a CUDA GPU")
    with pytest.raises(RingError, match=r"needs CUDA ranks, .* runs on cpu \(CUDA available: "):
        resolve_transport("device", CPU)


def test_cpu_ranks_on_a_machine_with_gpus_still_use_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda_machine(monkeypatch, gpus=2)
    assert resolve_transport(AUTO, CPU)[0] == "host"
    with pytest.raises(RingError, match=r"runs on cpu \(CUDA available: True\); use transport"):
        resolve_transport("device", CPU)


def test_gpu_ranks_get_the_transport_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_machine(monkeypatch, gpus=2)
    assert resolve_transport("host", GPU) == ("host", "requested in the config")
    assert resolve_transport("device", GPU) == ("device", "requested in the config")


@pytest.mark.parametrize(
    ("gpus", "no_peer_access", "expected"),
    [
        (1, [], ("device", "auto: CUDA IPC between GPUs with peer access")),
        (3, [], ("device", "auto: CUDA IPC between GPUs with peer access")),
        (
            3,
            [(1, 2)],
            ("host", "auto: GPUs 1 and 2 have no peer access, so CUDA IPC cannot cross them"),
        ),
        (
            2,
            [(0, 1)],
            ("host", "auto: GPUs 0 and 1 have no peer access, so CUDA IPC cannot cross them"),
        ),
    ],
)
def test_auto_uses_cuda_ipc_only_where_every_gpu_reaches_every_other(
    monkeypatch: pytest.MonkeyPatch,
    gpus: int,
    no_peer_access: list[tuple[int, int]],
    expected: tuple[str, str],
) -> None:
    cuda_machine(monkeypatch, gpus, no_peer_access)
    assert resolve_transport(AUTO, GPU) == expected


def test_a_cpu_ring_keeps_its_slots_in_the_host_segment_and_says_why() -> None:
    """An auto ring on the CPU: every rank reads the host transport back from the control
    block, with auto's reason; its slots are the /dev/shm segment of the run."""
    rings = rw.in_process_ranks(1, 1, transport=AUTO)
    run_id = rings[0].spec.run_id
    try:
        assert [ring.transport for ring in rings] == ["host", "host"]
        assert all(isinstance(ring.payload, HostPayload) for ring in rings)
        snapshot = rings[1].snapshot()
        assert (snapshot.transport, snapshot.transport_reason) == (
            "host",
            "auto: ranks run on cpu, not on a CUDA GPU",
        )
        size = os.stat("/dev/shm" + data_name(run_id)).st_size
        assert size == rings[0].spec.num_slots * SlotLayout.of(rings[0].spec).slot_bytes
        rw.publish(rings[0].producer(), seq=0)
        assert rw.item_ok(rings[1].consumer().take(timeout=10))
    finally:
        rw.close_ranks(rings)
    assert not [e for e in os.listdir("/dev/shm") if run_id in e]
