"""ringtrain-eval's worker processes take the next conversation when they finish one
(ringtrain.eval.processes): a worker held up by a long answer does not hold back the
conversations another worker could decode."""

from __future__ import annotations

import time
from pathlib import Path

from ringtrain.eval.processes import local_pull, run_workers

TASKS = list(range(10))


def _decode(released: Path, share: tuple[int, int], pull) -> int:
    """Report (worker, task) for every task pulled; task 0 (a long answer) is held until
    the test releases it, which it does once every other task was reported. Returns how
    many tasks this worker took."""
    taken = 0
    report = None
    while (task := pull(report)) is not None:
        taken += 1
        if task == 0:
            deadline = time.monotonic() + 120
            while not released.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("task 0 was never released")
                time.sleep(0.01)
        report = (share[0], task)
    return taken


def test_a_worker_held_up_does_not_hold_back_the_other_tasks(tmp_path: Path) -> None:
    released = tmp_path / "released"
    reports: list[tuple[int, int]] = []

    def on_report(report: tuple[int, int]) -> None:
        reports.append(report)
        if len(reports) == len(TASKS) - 1:
            released.touch()  # every task but the held one is done

    taken = run_workers(_decode, released, 2, TASKS, on_report)

    assert sorted(task for _, task in reports) == TASKS
    holder = next(worker for worker, task in reports if task == 0)
    # The holder decoded task 0 alone; the other worker took the nine others meanwhile.
    # With fixed shares of five each, task 0's holder would wait for ever on its other four.
    assert taken[holder] == 1 and taken[1 - holder] == len(TASKS) - 1
    assert reports[-1] == (holder, 0)


def test_one_process_decodes_every_task_through_the_same_hand_out() -> None:
    reports: list[tuple[int, int]] = []
    pull = local_pull(TASKS[1:], reports.append)
    assert _decode(Path("unused"), (0, 1), pull) == len(TASKS) - 1
    assert [task for _, task in reports] == TASKS[1:]
