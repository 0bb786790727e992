"""The mutants of what ringtrain-stat shows: a ring's report, the verdict it ends with (the
trainer's newest, a dead rank's first, else its own over its window), which metrics file it
reads, which ring it opens and when a watched ring has ended (ringtrain/monitor/stat_view.py)."""

from __future__ import annotations

from tools.mutation.mutant import Group, Mutant

STAT_TESTS = (
    "tests/test_stat_view.py", "tests/test_stat.py", "tests/test_stat_cli.py",
    "tests/test_monitor_stat.py",
)  # fmt: skip

GROUPS = (
    Group("stat view", "ringtrain/monitor/stat_view.py", STAT_TESTS, (
        Mutant("a ready slot shown as reading", "\"ready\": \"R\",", "\"ready\": \"r\","),
        Mutant("a dead rank shown by its status", "status = r.status if r.alive else",
               "status = r.status if True else"),
        Mutant("the run's rate over the window's", "rate = r.interval_items_per_s if r.interval_items_per_s is not None else r.items_per_s",
               "rate = r.items_per_s"),
        Mutant("a blocked share shown for consumers",
               "{_pct(blocked) if r.is_producer else '-':>7}",
               "{_pct(blocked) if True else '-':>7}"),
        Mutant("the window's waits not shown", "over = f\", {{}} last {snap.interval_s:.1f} s\" if snap.interval_s else \"\"",
               "over = \"\""),
        Mutant("the target groups not named", "    if not snap.groups:\n        return []",
               "    if True:\n        return []"),
        Mutant("the oldest recorded verdict shown", "for line in reversed(lines):",
               "for line in lines:"),
        Mutant("a torn verdict line ends the search",
               "        except (msgspec.DecodeError, KeyError, TypeError, ValueError):\n            continue",
               "        except (msgspec.DecodeError, KeyError, TypeError, ValueError):\n            return None"),
        Mutant("a dead rank not named first", "    if current.fatal:\n", "    if False:\n"),
        Mutant("the trainer's verdict not shown",
               "return recorded_verdict(metrics) or live_verdict(current, previous)",
               "return live_verdict(current, previous)"),
        Mutant("stat's window since start-up always",
               "window = f\"over the last {current.interval_s:.1f} s\" if previous else \"since start-up\"",
               "window = \"since start-up\""),
        Mutant("the run directory given not read first",
               "if run is not None and (Path(run).expanduser() / METRICS_FILE).is_file():",
               "if False:"),
        Mutant("another user's ring listed", "rings = rings if everyone else [r for r in rings if is_own(r)]",
               "rings = rings"),
        Mutant("one of several rings opened unasked", "    if len(own) != 1:\n", "    if len(own) > 1:\n"),
        Mutant("a ring with a live rank taken as ended",
               "return snap.closing or all(r.status in left or not r.alive for r in snap.ranks)",
               "return snap.closing or any(r.status in left or not r.alive for r in snap.ranks)"),
        Mutant("a closing ring watched on", "return snap.closing or all(",
               "return False or all("),
    )),
)  # fmt: skip
