"""Benchmark loading a target checkpoint from local disk: GB/s from a cold and a warm cache.

Writes a checkpoint of the first 12 layers of Qwen3-30B-A3B (qwen3_moe; its config.json
says 12 layers) as the hub lays it out: one tensor per expert
(``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight``), the router
(``mlp.gate.weight``), attention and norms, ``model.embed_tokens.weight``,
``model.norm.weight`` and ``lm_head.weight``; bf16 random values, shards of about 4 GB
and a ``model.safetensors.index.json`` (about 16 GB in all). Then it times
``ringtrain.target.loader.load_target(dir, device, compile="off", tap_layers=[1, 3, 6, 9,
11])`` twice: with a cold file cache and with a warm one. Cold means the kernel's page
cache was dropped first: ``echo 3 > /proc/sys/vm/drop_caches`` where permitted (root and a
writable /proc/sys), else ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every shard (the JSON
says which, ``cold_method``).

Reported per load: seconds, GB/s (bytes of the kept tensors / seconds, 1 GB = 1e9 bytes)
and the load time of the full 48-layer model extrapolated from it (the same rate over the
full model's layer bytes plus its embedding and norm; aim: 60 s or less warm). Only kept
tensors may be read: the LM head (the only tensor this cut drops) must not be. The JSON
holds the kept tensors' bytes, the loaded model's parameter bytes (equal to them) and,
from the page cache's residency (mincore(2) over each tensor's byte range), how much of
the kept and of the unkept tensors the cold load brought into memory (``only_kept_read``;
None when the cache could not be emptied, e.g. a tmpfs directory: see ``filesystem``).
The checkpoint is deleted at the end unless ``--keep``.

    python -m tools.bench.bench_load --json                          # GPU machine, /tmp
    python -m tools.bench.bench_load --device cpu --small --json     # smoke run without a GPU
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import mmap
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import CONFIG_MAPPING, PretrainedConfig

from ringtrain.target.loader import load_target
from tools.bench.bench_report import report_head, save_report
from tools.bench.bench_target import build_config
from tools.bench.model_shapes import QWEN3_30B_A3B

SHAPE = "qwen3-30b-a3b"
SLICE_LAYERS = 12
TAP_LAYERS = [1, 3, 6, 9, 11]
GB = 1e9
DTYPE = torch.bfloat16
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
PAGE = mmap.PAGESIZE
LM_HEAD = "lm_head.weight"


def slice_config(small: bool) -> PretrainedConfig:
    """The config of the checkpoint: the first 12 layers of the shape (``small``: of its
    toy-sized variant)."""
    values = {**build_config(SHAPE, small).to_dict(), "num_hidden_layers": SLICE_LAYERS}
    config = CONFIG_MAPPING[values["model_type"]].from_dict(values)
    config.architectures = ["Qwen3MoeForCausalLM"]
    return config


def layer_tensors(config: PretrainedConfig, layer: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(key, shape) of one decoder layer's tensors, named as the hub's qwen3_moe checkpoints."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    expert = config.moe_intermediate_size
    prefix = f"model.layers.{layer}."
    yield prefix + "input_layernorm.weight", (hidden,)
    yield prefix + "post_attention_layernorm.weight", (hidden,)
    yield prefix + "self_attn.q_proj.weight", (q_width, hidden)
    yield prefix + "self_attn.k_proj.weight", (kv_width, hidden)
    yield prefix + "self_attn.v_proj.weight", (kv_width, hidden)
    yield prefix + "self_attn.o_proj.weight", (hidden, q_width)
    yield prefix + "self_attn.q_norm.weight", (head_dim,)
    yield prefix + "self_attn.k_norm.weight", (head_dim,)
    yield prefix + "mlp.gate.weight", (config.num_experts, hidden)
    for e in range(config.num_experts):
        yield prefix + f"mlp.experts.{e}.gate_proj.weight", (expert, hidden)
        yield prefix + f"mlp.experts.{e}.up_proj.weight", (expert, hidden)
        yield prefix + f"mlp.experts.{e}.down_proj.weight", (hidden, expert)


def checkpoint_tensors(config: PretrainedConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(key, shape) of every tensor of the checkpoint, in the order they are written."""
    yield "model.embed_tokens.weight", (config.vocab_size, config.hidden_size)
    for layer in range(config.num_hidden_layers):
        yield from layer_tensors(config, layer)
    yield "model.norm.weight", (config.hidden_size,)
    yield "lm_head.weight", (config.vocab_size, config.hidden_size)


def tensor_bytes(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel()) * DTYPE.itemsize


def shard_plan(config: PretrainedConfig, shard_bytes: float) -> list[list]:
    """The checkpoint's tensors grouped into shards of at most ``shard_bytes`` (or one
    tensor when it alone is larger), in order."""
    shards: list[list] = [[]]
    size = 0
    for key, shape in checkpoint_tensors(config):
        nbytes = tensor_bytes(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((key, shape))
        size += nbytes
    return shards


def write_checkpoint(
    directory: Path, config: PretrainedConfig, shard_bytes: float, device: torch.device
) -> int:
    """Write config.json, the shards and the index; return the bytes of all tensors.

    Values come from one random pool (drawn on ``device``), each tensor a copy of a
    different window of it: random bytes on disk without drawing 16 GB of random numbers.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    largest = max(torch.Size(shape).numel() for _, shape in checkpoint_tensors(config))
    pool = torch.randn(largest + 4099, device=device).mul_(0.02).to(DTYPE).cpu()
    shards = shard_plan(config, shard_bytes)
    weight_map, total = {}, 0
    for number, members in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for index, (key, shape) in enumerate(members):
            numel = torch.Size(shape).numel()
            start = (index * 4099) % (pool.numel() - numel + 1)
            tensors[key] = pool[start : start + numel].view(shape).clone()
            weight_map[key] = name
            total += tensor_bytes(shape)
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        del tensors
        print(f"wrote {name} ({len(members)} tensors)", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def drop_file_cache(directory: Path, method: str) -> str:
    """Evict the checkpoint from the page cache; return the method used."""
    os.sync()
    if method in ("auto", "drop_caches"):
        try:
            DROP_CACHES.write_text("3\n")
            return "drop_caches"
        except OSError:
            if method == "drop_caches":
                raise
    for shard in sorted(directory.glob("*.safetensors")):
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise"


def tensor_ranges(shard: Path) -> dict[str, tuple[int, int]]:
    """Byte range of each tensor in a safetensors file (after its 8-byte length and JSON
    header)."""
    with shard.open("rb") as file:
        header_len = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(header_len))
    base = 8 + header_len
    return {
        key: (base + entry["data_offsets"][0], base + entry["data_offsets"][1])
        for key, entry in header.items()
        if key != "__metadata__"
    }


def resident_pages(path: Path) -> np.ndarray:
    """1 for each page of the file that is in the page cache, else 0 (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = ctypes.create_string_buffer(-(-size // PAGE))
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            if libc.mincore(address, size, pages) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return np.frombuffer(pages.raw, dtype=np.uint8) & 1


def cached_bytes(directory: Path, unkept: set[str]) -> tuple[int, int]:
    """Bytes of the kept and of the ``unkept`` tensors now in the page cache (pages a
    tensor touches, so up to two pages more per tensor)."""
    kept = dropped = 0
    for shard in sorted(directory.glob("*.safetensors")):
        resident = resident_pages(shard)
        for key, (start, end) in tensor_ranges(shard).items():
            cached = int(resident[start // PAGE : -(-end // PAGE)].sum()) * PAGE
            if key in unkept:
                dropped += cached
            else:
                kept += cached
    return kept, dropped


def filesystem(directory: Path) -> str:
    """The filesystem type of the mount holding ``directory`` (e.g. ext4, xfs, tmpfs)."""
    best, kind = "", "unknown"
    resolved = str(directory.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def timed_load(directory: Path, device: torch.device) -> dict:
    """Seconds of one load and the loaded parameters' size in the checkpoint's dtype."""
    started = time.perf_counter()
    target = load_target(directory, device=device, compile="off", tap_layers=TAP_LAYERS)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    loaded = sum(p.numel() for p in target.module.parameters()) * DTYPE.itemsize
    del target
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"seconds": seconds, "loaded_param_bytes": loaded}


def rates(load: dict, kept_bytes: int, full_bytes: int) -> dict:
    """A load's GB/s over the kept bytes and the full model's load time at that rate."""
    return {
        **load,
        "seconds": round(load["seconds"], 2),
        "gbps": round(kept_bytes / load["seconds"] / GB, 2),
        "full_model_s_est": round(load["seconds"] * full_bytes / kept_bytes, 1),
    }


def bench(args: argparse.Namespace, directory: Path, device: torch.device) -> dict:
    """Write the checkpoint, load it cold then warm, and report."""
    config = slice_config(args.small)
    full_layers = QWEN3_30B_A3B["num_hidden_layers"]
    started = time.perf_counter()
    checkpoint_bytes = write_checkpoint(directory, config, args.shard_gb * GB, device)
    write_s = time.perf_counter() - started
    # The deepest tap is the checkpoint's last layer: every layer and the final norm are
    # kept, only the LM head is not.
    unkept_bytes = tensor_bytes((config.vocab_size, config.hidden_size))
    kept_bytes = checkpoint_bytes - unkept_bytes
    layer_bytes = sum(tensor_bytes(shape) for _, shape in layer_tensors(config, 0))
    full_bytes = kept_bytes + (full_layers - config.num_hidden_layers) * layer_bytes
    cold_method = drop_file_cache(directory, args.cold)
    cached_before = sum(cached_bytes(directory, {LM_HEAD}))
    print(f"loading with a cold file cache (emptied by {cold_method})", flush=True)
    cold = rates(timed_load(directory, device), kept_bytes, full_bytes)
    kept_cached, unkept_cached = cached_bytes(directory, {LM_HEAD})
    print(f"cold load {cold['seconds']} s; loading again, warm", flush=True)
    warm = rates(timed_load(directory, device), kept_bytes, full_bytes)
    return {
        **report_head("bench_load", device),
        "shape": SHAPE,
        "directory": str(directory),
        "filesystem": filesystem(directory),
        "checkpoint_layers": config.num_hidden_layers,
        "full_layers": full_layers,
        "tap_layers": TAP_LAYERS,
        "shards": len(list(directory.glob("*.safetensors"))),
        "checkpoint_bytes": checkpoint_bytes,
        "kept_bytes": kept_bytes,
        "unkept_bytes": unkept_bytes,
        "full_model_bytes": full_bytes,
        "write_s": round(write_s, 1),
        "cold_method": cold_method,
        "cached_bytes_before_cold": cached_before,
        "cached_bytes_after_cold": {"kept": kept_cached, "unkept": unkept_cached},
        "cold": cold,
        "warm": warm,
        "loaded_equals_kept": cold["loaded_param_bytes"] == kept_bytes,
        # None: the cache was not emptied (e.g. a tmpfs directory), so reads are unseen.
        "only_kept_read": unkept_cached < unkept_bytes / 2
        if cached_before < checkpoint_bytes / 100
        else None,
        "target_load_gbps": warm["gbps"],
        "target_load_gbps_cold": cold["gbps"],
        "full_model_load_s_est_warm": warm["full_model_s_est"],
        "full_model_load_s_est_cold": cold["full_model_s_est"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ringtrain-bench-load"))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint at the end")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shard-gb", type=float, default=4.0, help="shard size (GB)")
    parser.add_argument(
        "--cold",
        choices=["auto", "drop_caches", "fadvise"],
        default="auto",
        help="how to empty the page cache before the cold load (auto: drop_caches where "
        "permitted, else fadvise)",
    )
    parser.add_argument("--small", action="store_true", help="toy sizes (CPU smoke run)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.small:
        args.shard_gb = min(args.shard_gb, 0.002)
    directory = args.dir.expanduser()
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(
            f"{directory} exists and is not empty; give --dir a new or empty directory "
            f"(the benchmark deletes it at the end)"
        )
    device = torch.device(args.device)
    # A time limit's SIGTERM still deletes the checkpoint (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        report = bench(args, directory, device)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"{'load':<5} {'seconds':>8} {'GB/s':>7} {'48-layer s':>10}")
    for name in ("cold", "warm"):
        row = report[name]
        print(
            f"{name:<5} {row['seconds']:>8.2f} {row['gbps']:>7.2f} {row['full_model_s_est']:>10.1f}"
        )
    cached = report["cached_bytes_after_cold"]
    print(
        f"kept {report['kept_bytes'] / GB:.2f} GB of {report['checkpoint_bytes'] / GB:.2f} GB; "
        f"cold cache by {report['cold_method']} on {report['filesystem']}; read by the cold "
        f"load: kept {cached['kept'] / GB:.2f} GB, unkept {cached['unkept'] / GB:.3f} GB; "
        f"only kept read: {report['only_kept_read']}"
    )
    save_report(report, "bench_load", args.json)


if __name__ == "__main__":
    main()
