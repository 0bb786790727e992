"""The embedded default's inputs: a tiny hybrid target and a synthetic dataset.

When [target] path or [data] path is empty, the built-in one is written under
`<run_dir>/builtin/` (once; later runs reuse it). The first rank to take the file lock
builds; the others wait on the lock and then find it built. Writes go to a temporary
name first, so a crash never leaves a half-written directory that looks complete.
"""

from __future__ import annotations

import fcntl
import functools
import shutil
from collections.abc import Callable
from pathlib import Path

from ringtrain.config import Config
from ringtrain.data import write_synthetic_dataset
from ringtrain.target import build_tiny_target, read_target_config
from ringtrain.trainer.logs import get_logger

SYNTHETIC_ROWS = 3000
SYNTHETIC_EVAL_ROWS = 30
SYNTHETIC_MEAN_LEN = 200
# Few enough motifs that every token has one place in the bank: each token determines
# the next, so the default run shows a drafter learning within a minute on a CPU.
SYNTHETIC_MOTIFS = 24


def _build_once(path: Path, what: str, build: Callable[[Path], None]) -> None:
    if path.exists():
        return
    get_logger().info("writing the built-in %s to %s", what, path)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build(partial)
    partial.rename(path)


def prepare_builtin_inputs(config: Config, run_dir: Path) -> tuple[Path, Path, Path | None]:
    """Paths of the target, the dataset and the held-out split (None: none given), building
    the built-in ones where none is given (the built-in dataset comes with a held-out split).
    Ranks that find them built pass the lock at once: nothing is read under it."""
    builtin = run_dir / "builtin"
    target_path = (
        Path(config.target.path).expanduser() if config.target.path else builtin / "target"
    )
    data_path = Path(config.data.path).expanduser() if config.data.path else builtin / "data"
    if config.data.eval_path:
        eval_path: Path | None = Path(config.data.eval_path).expanduser()
    else:
        eval_path = None if config.data.path else builtin / "eval"
    if config.target.path and config.data.path:
        return target_path, data_path, eval_path
    builtin.mkdir(parents=True, exist_ok=True)
    with (builtin / ".lock").open("w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        if not config.target.path:
            _build_once(
                target_path,
                "tiny hybrid target",
                lambda d: build_tiny_target(d, seed=config.run.seed),
            )
        if not config.data.path:
            weights = not config.target.random_weights
            # Read once, and only when a split is built; the structure is checked in the
            # pre-flight that follows (the model code takes seconds to import).
            vocab_size = functools.cache(
                lambda: read_target_config(target_path, weights, structure=False).vocab_size
            )

            def synthetic(directory: Path, rows: int, seed: int) -> None:
                write_synthetic_dataset(
                    directory,
                    rows=rows,
                    vocab_size=vocab_size(),
                    mean_len=SYNTHETIC_MEAN_LEN,
                    seed=seed,
                    num_motifs=SYNTHETIC_MOTIFS,
                    bank_seed=config.data.seed,
                )

            seed = config.data.seed
            _build_once(
                data_path, "synthetic dataset", lambda d: synthetic(d, SYNTHETIC_ROWS, seed)
            )
            _build_once(
                builtin / "eval",
                "held-out split",
                lambda d: synthetic(d, SYNTHETIC_EVAL_ROWS, seed + 1),
            )
    return target_path, data_path, eval_path
