"""The few CUDA runtime calls the ring needs that torch does not expose.

ctypes on the libcudart that torch already loaded: plain cudaMalloc for producer slabs
(never the caching allocator's expandable segments, which CUDA IPC cannot export),
IPC handles for those slabs, and cudaHostRegister for the host payload segment.
"""

from __future__ import annotations

import ctypes
import functools

import torch

IPC_HANDLE_BYTES = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_HOST_REGISTER_PORTABLE = 1


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


@functools.cache
def _cudart() -> ctypes.CDLL:
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    lib = ctypes.CDLL(min(paths) if paths else "libcudart.so")
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcMemHandle), ctypes.c_void_p]
    lib.cudaIpcOpenMemHandle.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        _IpcMemHandle,
        ctypes.c_uint,
    ]
    lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        text = _cudart().cudaGetErrorString(code).decode()
        raise RuntimeError(f"{what} failed: CUDA error {code} ({text})")


class _CudaArray:
    """Minimal __cuda_array_interface__ holder so torch.as_tensor can wrap a raw pointer."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def wrap_device_pointer(ptr: int, nbytes: int) -> torch.Tensor:
    """A flat uint8 CUDA tensor over [ptr, ptr + nbytes) (not owning the memory)."""
    return torch.as_tensor(_CudaArray(ptr, nbytes))


def device_malloc(nbytes: int, device: torch.device) -> int:
    """cudaMalloc on `device`; returns the pointer."""
    ptr = ctypes.c_void_p()
    with torch.cuda.device(device):
        _check(_cudart().cudaMalloc(ctypes.byref(ptr), nbytes), "cudaMalloc")
    return int(ptr.value)


def device_free(ptr: int, device: torch.device) -> None:
    """cudaFree a pointer from `device_malloc`."""
    with torch.cuda.device(device):
        _check(_cudart().cudaFree(ptr), "cudaFree")


def ipc_get_handle(ptr: int) -> bytes:
    """The 64-byte CUDA IPC handle of a cudaMalloc pointer."""
    handle = _IpcMemHandle()
    _check(_cudart().cudaIpcGetMemHandle(ctypes.byref(handle), ptr), "cudaIpcGetMemHandle")
    # Not `handle.reserved`: a c_char array field reads back cut at its first NUL byte.
    return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)


def ipc_open_handle(handle: bytes, device: torch.device) -> int:
    """Map another process's allocation into this one (on `device`); returns the pointer."""
    ptr = ctypes.c_void_p()
    with torch.cuda.device(device):
        code = _cudart().cudaIpcOpenMemHandle(
            ctypes.byref(ptr),
            _IpcMemHandle.from_buffer_copy(handle),
            _IPC_LAZY_ENABLE_PEER_ACCESS,
        )
    _check(code, "cudaIpcOpenMemHandle")
    return int(ptr.value)


def ipc_close(ptr: int, device: torch.device) -> None:
    """Unmap a pointer from `ipc_open_handle`."""
    with torch.cuda.device(device):
        _check(_cudart().cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")


def host_register(ptr: int, nbytes: int) -> None:
    """Pin an existing host mapping for full-speed DMA (cudaHostRegister)."""
    code = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _HOST_REGISTER_PORTABLE)
    _check(int(code), "cudaHostRegister")


def host_unregister(ptr: int) -> None:
    """Undo `host_register`."""
    _check(int(torch.cuda.cudart().cudaHostUnregister(ptr)), "cudaHostUnregister")
