#!/usr/bin/env python3
"""Copy rate from another process's GPU memory on the same GPU, by how it is shared.

    tools/bench/bench_ipc_copy.py [--slots 4] [--item-mb 256] [--reps 40] [--extra-bytes 38912]
        [--json]

A producer process allocates `--slots` buffers of `--item-mb` MiB in three ways and
shares them with a consumer process on the same GPU:

- `ipc`: one cudaMalloc slab exported with a CUDA IPC handle, as the ring's device
  transport does;
- `vmm_fd`: one slab from the CUDA virtual memory API (cuMemCreate at the recommended
  granularity, 2 MiB pages), exported as a POSIX file descriptor that goes to the
  consumer over a Unix socket; the consumer maps it with cuMemMap;
- `vmm_torch`: torch tensors in expandable segments (the same API underneath), shared
  through torch.multiprocessing.

The consumer times device copies of one buffer into its own memory, in GPU microseconds
per copy: from the first buffer again and again (`same`) and from every buffer in turn
(`in_turn`), for each way and for buffers of its own (`local`). The `ipc` and `vmm_fd`
slabs are made once exactly `--slots` x `--item-mb` long and once longer by each value of
`--extra-bytes` (`ipc_plus<E>_in_turn_us`): a ring slab holds a few small arrays per slot
besides the items. On the H200 an `ipc` slab 38,912 bytes longer than whole 2 MiB
pages is read in turn about 25% slower (160 against 128 us per 256 MiB; 1 MiB longer,
1% slower; whole pages, full speed); that is why the ring's device transport rounds
its slabs up to whole 2 MiB pages. A way that fails reports `<way>_error` instead of
its times.

Prints a short table, then one JSON object as the LAST line (also written to
$OUT/bench_ipc_copy.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import queue
from multiprocessing import reduction

import torch
import torch.multiprocessing as tmp

from ringtrain.ring import cuda
from tools.bench.bench_report import print_report
from tools.bench.gpu_timing import gpu_us_per_call, require_cuda

WAIT_S = 120
_LOCATION_DEVICE = 1
_ALLOCATION_PINNED = 1
_HANDLE_POSIX_FD = 1
_GRANULARITY_RECOMMENDED = 1
_ACCESS_READ_WRITE = 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compression_type", ctypes.c_ubyte),
        ("gpu_direct_rdma_capable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requested_handle_types", ctypes.c_int),
        ("location", _Location),
        ("win32_handle_metadata", ctypes.c_void_p),
        ("alloc_flags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    u64, size = ctypes.c_ulonglong, ctypes.c_size_t
    lib.cuMemGetAllocationGranularity.argtypes = [
        ctypes.POINTER(size),
        ctypes.POINTER(_AllocProp),
        ctypes.c_int,
    ]
    lib.cuMemCreate.argtypes = [ctypes.POINTER(u64), size, ctypes.POINTER(_AllocProp), u64]
    lib.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, u64, ctypes.c_int, u64]
    lib.cuMemImportFromShareableHandle.argtypes = [
        ctypes.POINTER(u64),
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    lib.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size, size, u64, u64]
    lib.cuMemMap.argtypes = [u64, size, size, u64, u64]
    lib.cuMemSetAccess.argtypes = [u64, size, ctypes.POINTER(_AccessDesc), size]
    lib.cuMemUnmap.argtypes = [u64, size]
    lib.cuMemAddressFree.argtypes = [u64, size]
    lib.cuMemRelease.argtypes = [u64]
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed: CUDA driver error {code}")


def _prop(device: int) -> _AllocProp:
    prop = _AllocProp()
    prop.type = _ALLOCATION_PINNED
    prop.requested_handle_types = _HANDLE_POSIX_FD
    prop.location = _Location(_LOCATION_DEVICE, device)
    return prop


def _vmm_size(nbytes: int, device: int) -> int:
    """`nbytes` rounded up to the recommended allocation granularity."""
    granularity = ctypes.c_size_t()
    prop = _prop(device)
    _check(
        _driver().cuMemGetAllocationGranularity(
            ctypes.byref(granularity), ctypes.byref(prop), _GRANULARITY_RECOMMENDED
        ),
        "cuMemGetAllocationGranularity",
    )
    step = granularity.value
    return -(-nbytes // step) * step


def _vmm_export(nbytes: int, device: int) -> tuple[int, int]:
    """(allocation handle, file descriptor) of a new physical allocation of `nbytes`."""
    handle, fd, prop = ctypes.c_ulonglong(), ctypes.c_int(), _prop(device)
    _check(
        _driver().cuMemCreate(ctypes.byref(handle), nbytes, ctypes.byref(prop), 0), "cuMemCreate"
    )
    _check(
        _driver().cuMemExportToShareableHandle(ctypes.byref(fd), handle.value, _HANDLE_POSIX_FD, 0),
        "cuMemExportToShareableHandle",
    )
    return handle.value, fd.value


def _vmm_map(fd: int, nbytes: int, device: int) -> tuple[int, int]:
    """Import the allocation behind `fd` and map it read-write; (address, handle)."""
    lib, handle, ptr = _driver(), ctypes.c_ulonglong(), ctypes.c_ulonglong()
    _check(
        lib.cuMemImportFromShareableHandle(ctypes.byref(handle), fd, _HANDLE_POSIX_FD),
        "cuMemImportFromShareableHandle",
    )
    _check(lib.cuMemAddressReserve(ctypes.byref(ptr), nbytes, 0, 0, 0), "cuMemAddressReserve")
    _check(lib.cuMemMap(ptr.value, nbytes, 0, handle.value, 0), "cuMemMap")
    access = _AccessDesc(_Location(_LOCATION_DEVICE, device), _ACCESS_READ_WRITE)
    _check(lib.cuMemSetAccess(ptr.value, nbytes, ctypes.byref(access), 1), "cuMemSetAccess")
    return ptr.value, handle.value


def _vmm_unmap(ptr: int, handle: int, nbytes: int) -> None:
    lib = _driver()
    _check(lib.cuMemUnmap(ptr, nbytes), "cuMemUnmap")
    _check(lib.cuMemAddressFree(ptr, nbytes), "cuMemAddressFree")
    _check(lib.cuMemRelease(handle), "cuMemRelease")


def _copy_us(destination: torch.Tensor, sources: list[torch.Tensor], reps: int) -> float:
    """GPU microseconds of one copy into `destination`, from `sources` in turn."""
    return gpu_us_per_call(lambda k: destination.copy_(sources[k % len(sources)]), reps)


def _produce(slots: int, nbytes: int, extras: list[int], shared, socket, done) -> None:
    """Allocate the three kinds of buffers, share them, keep them alive until `done`."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    slabs = [cuda.device_malloc(slots * nbytes + extra, device) for extra in extras]
    shared.put([cuda.ipc_get_handle(slab) for slab in slabs])
    vmm_handles = []
    try:
        for extra in extras:
            handle, fd = _vmm_export(_vmm_size(slots * nbytes + extra, 0), 0)
            vmm_handles.append(handle)
            socket.send("fd")
            reduction.send_handle(socket, fd, None)
            os.close(fd)
    except RuntimeError as exc:
        socket.send(str(exc))
    tensors: list[torch.Tensor] = []
    try:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        tensors = [torch.ones(nbytes, dtype=torch.uint8, device=device) for _ in range(slots)]
        shared.put(tensors)
    except RuntimeError as exc:
        shared.put(str(exc))
    done.wait()
    del tensors
    for slab in slabs:
        cuda.device_free(slab, device)
    for handle in vmm_handles:
        _check(_driver().cuMemRelease(handle), "cuMemRelease")


def _in_turn(slab: torch.Tensor, slots: int, nbytes: int) -> list[torch.Tensor]:
    """The `slots` consecutive buffers of `nbytes` at the start of `slab`."""
    return [slab[k * nbytes : (k + 1) * nbytes] for k in range(slots)]


def _suffix(extra: int) -> str:
    return "" if extra == 0 else f"_plus{extra}"


def _consume(
    slots: int, nbytes: int, reps: int, extras: list[int], shared, socket, done, results
) -> None:
    """Open the producer's buffers and time the copies."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    report: dict = {}
    destination = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sources = {
        "local": [torch.ones(nbytes, dtype=torch.uint8, device=device) for _ in range(slots)]
    }
    pointers = [cuda.ipc_open_handle(h, device) for h in shared.get(timeout=WAIT_S)]
    for extra, ptr in zip(extras, pointers, strict=True):
        slab = cuda.wrap_device_pointer(ptr, slots * nbytes + extra)
        sources["ipc" + _suffix(extra)] = _in_turn(slab, slots, nbytes)
    mapped = []
    for extra in extras:
        message = socket.recv() if socket.poll(WAIT_S) else "no word from the producer"
        if message != "fd":
            report["vmm_fd_error"] = message
            break
        fd = reduction.recv_handle(socket)
        try:
            size = _vmm_size(slots * nbytes + extra, 0)
            mapped.append((*_vmm_map(fd, size, 0), size))
            slab = cuda.wrap_device_pointer(mapped[-1][0], size)
            sources["vmm_fd" + _suffix(extra)] = _in_turn(slab, slots, nbytes)
        except RuntimeError as exc:
            report["vmm_fd_error"] = str(exc)
            break
        finally:
            os.close(fd)
    del slab
    try:
        tensors = shared.get(timeout=WAIT_S)
    except (RuntimeError, OSError, queue.Empty) as exc:  # e.g. no right to the descriptors
        tensors = f"{type(exc).__name__}: {exc}"
    if isinstance(tensors, str):
        report["vmm_torch_error"] = tensors
    else:
        sources["vmm_torch"] = tensors
    for way, buffers in sources.items():
        report[f"{way}_same_us"] = round(_copy_us(destination, buffers[:1], reps), 1)
        report[f"{way}_in_turn_us"] = round(_copy_us(destination, buffers, reps), 1)
    torch.cuda.synchronize(device)
    # Drop every view of the producer's memory before unmapping it.
    sources.clear()
    del tensors
    for ptr in pointers:
        cuda.ipc_close(ptr, device)
    for entry in mapped:
        _vmm_unmap(*entry)
    done.set()
    results.put(report)


def main(argv: list[str] | None = None) -> dict:
    """Run the producer and consumer processes and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--item-mb", type=float, default=256.0)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument(
        "--extra-bytes",
        default="38912",
        help="comma-separated bytes added to the slabs' size, one slab of each way per value "
        "(0 is always measured)",
    )
    parser.add_argument(
        "--json", action="store_true", help="(the JSON line is always printed last)"
    )
    args = parser.parse_args(argv)
    require_cuda("bench_ipc_copy")
    nbytes = int(args.item_mb * (1 << 20))
    extras = sorted({0, *(int(e) for e in args.extra_bytes.split(","))})
    ctx = tmp.get_context("spawn")
    shared, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    producer_end, consumer_end = ctx.Pipe()  # a Unix socket pair: carries the descriptor
    producer = ctx.Process(
        target=_produce, args=(args.slots, nbytes, extras, shared, producer_end, done)
    )
    consumer = ctx.Process(
        target=_consume,
        args=(args.slots, nbytes, args.reps, extras, shared, consumer_end, done, results),
    )
    producer.start()
    consumer.start()
    consumer.join()
    done.set()
    producer.join()
    if consumer.exitcode != 0 or producer.exitcode != 0:
        raise SystemExit(
            f"bench_ipc_copy: consumer exited with {consumer.exitcode}, "
            f"producer with {producer.exitcode}"
        )
    report = {"slots": args.slots, "item_mb": args.item_mb, **results.get()}
    print_report(report, "bench_ipc_copy")
    return report


if __name__ == "__main__":
    main()
