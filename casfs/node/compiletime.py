"""Compile time: how long a job took to make an entry, and what hits on it saved.

*Misses* (``MissClock``): the view calls ``missed(path)`` for each lookup it
answers negatively (fuse mode; overlay mode's FUSE lower layer, which
overlayfs asks when the upper misses too). The first miss of each entry
(``CacheRules.entry_of``) is kept, in memory, at most ``CAP`` entries (the
oldest drop). At publication, ``compile_times`` gives one row of each timed
entry its compile seconds (extras ``cs``, docs/format.md): from that first
miss to the newest mtime of the entry's files being published, on its commit
record if the publication holds one, else on that newest file.

*Hits* (``Savings``): an open of a published file (every view mode reports
it: casfs.node.access) credits its entry once per epoch: ``entries_hit``,
and ``compile_ms_saved`` by the entry's ``cs`` if its rows carry one
(``entries_hit_untimed`` if not). The figures come from the served
generation's manifests, read once per mount in a thread (later generations:
only their new parts); hits before that are credited when it is done.

*Names* (``MissClock.named``): the first ``NAMED_CAP`` entries the mount's jobs
missed, in order, for the final stats: ``casfs run`` says which other namespace
of the family holds them (casfs.cli.misscause).

Both are estimates: docs/format.md ("cs") says what each view mode lacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from casfs.errors import CasfsError
from casfs.families import CacheRules
from casfs.promote.timing import compile_times, with_compile_times
from casfs.store.entry import Entry, compile_seconds
from casfs.util.counters import Counters

log = logging.getLogger(__name__)

__all__ = ["MissClock", "Savings", "compile_times", "parts_loader", "with_compile_times"]

CAP = 65536  # entries missed and not yet published, kept per namespace
SAVINGS_CAP = 400_000  # timed entries known per namespace (a manifest's bound)
WAITING_CAP = 65536  # hits waiting for the figures to load
MISSED_TOP = 50  # most-missed entries an outcome record names
NAMED_CAP = 4096  # entries missed by the mount's jobs, by name, for the final stats


class MissClock:
    def __init__(self, rules: CacheRules, counters: Counters) -> None:
        self.rules = rules
        self.counters = counters
        self._first: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        # Entries missed since the last outcome record, with how many lookups missed.
        self.missed_counts: Counter[str] = Counter()
        # Every entry missed since the mount started, first misses first (bounded).
        self._named: dict[str, None] = {}

    def missed(self, path: str) -> None:
        """A lookup of ``path`` found nothing (the view's thread: cheap)."""
        entry = self.rules.entry_of(path)
        if entry is None:
            return
        with self._lock:
            if len(self.missed_counts) < CAP or entry in self.missed_counts:
                self.missed_counts[entry] += 1
            if len(self._named) < NAMED_CAP:
                self._named[entry] = None
            if entry in self._first:
                return
            self._first[entry] = time.time_ns()
            if len(self._first) > CAP:
                self._first.popitem(last=False)
        self.counters.inc("entries_missed")

    def named(self) -> list[str]:
        """The entries missed since the mount started (the first NAMED_CAP), in order."""
        with self._lock:
            return list(self._named)

    def first_misses(self) -> dict[str, int]:
        with self._lock:
            return dict(self._first)

    def settle(self, entries: Iterable[str]) -> None:
        """These entries' figures are published: forget them."""
        with self._lock:
            for e in entries:
                self._first.pop(e, None)

    def take_missed(self) -> Counter[str]:
        with self._lock:
            out, self.missed_counts = self.missed_counts, Counter()
        return out


class Savings:
    """Hits per entry, and the compile seconds they saved (see the module docstring)."""

    def __init__(self, rules: CacheRules, counters: Counters,
                 load_parts: Callable[[int, set[str]], tuple[list[list[Entry]], set[str]]],
                 served_seq: Callable[[], int]) -> None:
        self.rules = rules
        self.counters = counters
        self._load_parts = load_parts  # (seq, parts known) -> (new parts' rows, their digests)
        self._served_seq = served_seq
        self._seconds: dict[str, float] = {}
        self._parts: set[str] = set()
        self._loaded_seq = 0
        self._hit: set[str] = set()  # credited this epoch
        self._waiting: list[str] = []
        self._loading = False
        self._lock = threading.Lock()
        self.saved_ms = 0  # what this process credited (outcome records take deltas)

    def new_epoch(self) -> None:
        with self._lock:
            self._hit.clear()

    def hit(self, path: str) -> None:
        """A published file of ``path``'s entry was opened."""
        entry = self.rules.entry_of(path)
        if entry is None:
            return
        with self._lock:
            if entry in self._hit:
                return
            if len(self._hit) < CAP * 4:
                self._hit.add(entry)
            if self._loaded_seq < self._served_seq():
                if len(self._waiting) < WAITING_CAP:
                    self._waiting.append(entry)
                start = not self._loading
                self._loading = True
            else:
                self._credit(entry)
                return
        if start:
            threading.Thread(target=self._load, name="casfs-savings", daemon=True).start()

    def _credit(self, entry: str) -> None:
        self.counters.inc("entries_hit")
        s = self._seconds.get(entry)
        if s is None:
            self.counters.inc("entries_hit_untimed")
            return
        ms = round(s * 1000)
        self.saved_ms += ms
        self.counters.inc("compile_ms_saved", ms)

    def _load(self) -> None:
        seq = self._served_seq()
        new: dict[str, float] = {}
        parts: set[str] = set()
        try:
            rows, parts = self._load_parts(seq, set(self._parts))
            for part in rows:
                for e in part:
                    s = compile_seconds(e)
                    entry = self.rules.entry_of(e.path) if s is not None else None
                    if entry is not None:
                        new[entry] = s  # type: ignore[assignment]  # not None here
        except (CasfsError, OSError) as e:
            self.counters.inc("compile_saved_errors")
            # Counted, not warned: an estimate the job does not need, and whatever kept the
            # generation from being read (a down root, a gc race) is said where it matters.
            log.info("compile time saved: cannot read the figures of generation %d: %s",
                        seq, e)
        with self._lock:
            room = SAVINGS_CAP - len(self._seconds)
            for k, v in new.items():
                if k in self._seconds or room > 0:
                    room -= k not in self._seconds
                    self._seconds[k] = v
            self._parts |= parts
            self._loaded_seq = max(self._loaded_seq, seq)  # failed too: no retry per hit
            waiting, self._waiting = self._waiting, []
            for entry in waiting:
                self._credit(entry)
            self._loading = False

    def wait_loaded(self, timeout: float = 10.0) -> bool:
        """Tests: the figures of the served generation are loaded."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if not self._loading and self._loaded_seq >= self._served_seq():
                    return True
            time.sleep(0.01)
        return False


def parts_loader(gens_of: Callable[[], Any], ns: str,
                 ) -> Callable[[int, set[str]], tuple[list[list[Entry]], set[str]]]:
    """Reads the manifest parts of generation ``seq`` not known yet."""

    def load(seq: int, known: set[str]) -> tuple[list[list[Entry]], set[str]]:
        if not seq:
            return [], set()
        gens = gens_of()
        rec = gens.record(ns, seq, cached=True)
        todo = [p for p in rec.parts if p.digest not in known]
        return [gens.part_entries(p) for p in todo], {p.digest for p in todo}

    return load
