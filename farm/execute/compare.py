"""The updater comparison: SmartMask and ShiftPointer must produce identical tokens at temperature 0.

Upstream has no test comparing the two updaters; this is the farm's own correctness check. It compares
token ids when the runner writes them (the host runner does) and the output text bytes otherwise (a
stock qnn_llama_runner writes only outputs.txt). Two empty outputs (no text, or no generated token
ids) are never an agreement: a runner that produced nothing has not shown anything.

Where both runs dumped their logits (``--dump_logits_path``, eval_mode 0), the logits are compared
too, row by row: identical inputs must give identical logits, so a divergence shows in them before
it flips an argmax. Equal up to ``logits_tolerance_ulp`` (the rounding of the layouts' different
summation order); the largest difference and the first step that differs are reported either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from farm.bundle.manifest import Bundle
from farm.device.protocol import DeviceLike
from farm.execute.run import RunResult, run, takes_flag
from farm.execute.runprofile import RunRequest
from farm.vocab import Updater

if TYPE_CHECKING:
    from farm.runner.logits import LogitsDiff

UPDATER_PAIR: tuple[Updater, Updater] = (Updater.SMART_MASK, Updater.SHIFT_POINTER)
LOGITS_TOLERANCE_ULP = 2


@dataclass
class Comparison:
    serial: str
    mode: str
    prompt: str
    seq_len: int
    results: dict[str, RunResult] = field(default_factory=dict)
    # Measured on the reference model (kv, 3 prompts to the end of its context): the layouts differ
    # by at most 1 ulp of a row's largest logit (their summation order); 2 leaves room for one more.
    logits_tolerance_ulp: int = LOGITS_TOLERANCE_ULP
    _logits_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def compared_by(self) -> str:
        return "token ids" if all(r.generated_ids is not None for r in self.results.values()) \
            else "output text"

    def _sequences(self) -> dict[str, list[int] | bytes]:
        if self.compared_by == "token ids":
            return {u: r.generated_ids for u, r in self.results.items()}
        return {u: r.text_bytes or b"" for u, r in self.results.items()}

    def _missing(self) -> list[str]:
        return [u for u in UPDATER_PAIR if u not in self.results]

    def _empty(self) -> list[str]:
        """The updaters whose run produced nothing to compare (no generated ids / no output text)."""
        seqs = self._sequences()
        return [u for u in UPDATER_PAIR if u in seqs and not seqs[u]]

    @property
    def tokens_agree(self) -> bool:
        if self._missing() or self._empty():
            return False  # nothing produced is never an agreement
        seqs = list(self._sequences().values())
        return len(seqs) == len(UPDATER_PAIR) and all(s == seqs[0] for s in seqs)

    @property
    def agree(self) -> bool:
        return self.tokens_agree and self.logits_problem() is None

    def logits_dumped(self) -> list[str]:
        return [u for u in UPDATER_PAIR if u in self.results and self.results[u].logits is not None]

    @property
    def _logits(self) -> tuple[LogitsDiff | None, str | None]:
        if self._missing() or len(self.logits_dumped()) < len(UPDATER_PAIR):
            return None, None
        # Kept for the very results and tolerance it was computed from: a comparison whose results
        # change (filled in one by one) is judged on what it holds now, never on an older answer.
        key = (*(id(self.results[u]) for u in UPDATER_PAIR),
               *(id(self.results[u].logits) for u in UPDATER_PAIR), self.logits_tolerance_ulp)
        if self._logits_cache is None or self._logits_cache[0] != key:
            self._logits_cache = (key, self._diff_logits())
        return self._logits_cache[1]

    def _diff_logits(self) -> tuple[LogitsDiff | None, str | None]:
        from farm.runner.logits import LogitsDumpError, diff_logits, read_logits_bytes  # noqa: PLC0415
        try:
            a, b = (read_logits_bytes(self.results[u]) for u in UPDATER_PAIR)
            return diff_logits(a, b, tolerance_ulp=self.logits_tolerance_ulp), None
        except LogitsDumpError as e:  # the runner's output is malformed: a failure, never a pass
            return None, str(e)

    @property
    def logits(self) -> LogitsDiff | None:
        """The row-by-row difference of both runs' logits; None unless both dumped readable ones."""
        return self._logits[0]

    def logits_problem(self) -> str | None:
        """Why the logits do not agree; None when they do or neither run dumped them."""
        dumped = self.logits_dumped()
        if not dumped:
            return None
        if len(dumped) < len(UPDATER_PAIR):  # asked of both; one without is not evidence of sameness
            return f"only {dumped[0]} dumped its logits"
        d, unreadable = self._logits
        if unreadable:
            return f"the logits cannot be compared: {unreadable}"
        if d is None or d.identical:
            return None
        if d.first_differing_row is None:
            return f"{UPDATER_PAIR[0]} dumped {d.rows[0]} logits rows and {UPDATER_PAIR[1]} {d.rows[1]}"
        return (f"their logits differ from {self.step_name(d.first_differing_row)} on: max |diff| "
                f"{d.max_abs_diff:.6g} ({d.max_ulp} ulp, tolerance {d.tolerance_ulp})")

    def step_name(self, row: int) -> str:
        """A logits row as the run's step: prompt token i, or decode step j (eval_mode 0: one row each)."""
        observer = self.results[UPDATER_PAIR[0]].observer or {}
        n_prompt = observer.get("prompt_tokens")
        if isinstance(n_prompt, int) and row >= n_prompt:
            return f"decode step {row - n_prompt}"
        return f"prompt token {row}" if isinstance(n_prompt, int) else f"row {row}"

    def logits_summary(self) -> str:
        """One line for the report: how close the logits are, or why they were not compared."""
        dumped = self.logits_dumped()
        if not dumped:
            return "not dumped"
        d, unreadable = self._logits
        if d is None:
            return unreadable or f"only {dumped[0]} dumped"
        where = "no difference" if d.first_changed_row is None else \
            f"first difference at {self.step_name(d.first_changed_row)}"
        return (f"{d.rows_compared} rows, max |diff| {d.max_abs_diff:.6g} ({d.max_ulp} ulp, "
                f"tolerance {d.tolerance_ulp}); {where}")

    def first_divergence(self) -> int | None:
        if self._missing():
            return None
        a, b = (self._sequences()[u] for u in UPDATER_PAIR)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None if len(a) == len(b) else min(len(a), len(b))

    def explain(self) -> str:
        where = f"on {self.serial} ({self.mode})"
        if missing := self._missing():
            return f"no result for {' and '.join(missing)} {where}: nothing to compare"
        unit = "generated token ids" if self.compared_by == "token ids" else "output text"
        if empty := self._empty():
            which = "both" if len(empty) == len(UPDATER_PAIR) else empty[0]
            return (f"{' and '.join(UPDATER_PAIR)} do not agree {where}: {which} produced no {unit} "
                    f"(empty outputs are never an agreement)")
        if self.tokens_agree:
            n = len(self._sequences()[UPDATER_PAIR[0]])
            said = f"{' and '.join(UPDATER_PAIR)} agree on {n} {self.compared_by.split()[-1]}"
            if problem := self.logits_problem():
                return f"{said} {where}, but {problem}"
            return said if not self.logits_dumped() else f"{said}; logits: {self.logits_summary()}"
        i = self.first_divergence()
        a, b = (self._sequences()[u] for u in UPDATER_PAIR)
        said = (f"{UPDATER_PAIR[0]} and {UPDATER_PAIR[1]} diverge at {self.compared_by} index {i} "
                f"{where}: {a[i:i + 5]!r} vs {b[i:i + 5]!r}")
        return said if not self.logits_dumped() else f"{said}; logits: {self.logits_summary()}"

    def tok_s(self) -> dict[str, float | None]:
        return {u: r.tokens_per_s for u, r in self.results.items()}


def compare_updaters(device: DeviceLike, bundle: Bundle, *, mode: str, prompt: str, seq_len: int,
                     timeout: float = 600.0, base: RunRequest | None = None,
                     updaters: Sequence[str] = UPDATER_PAIR, dump_logits: bool | None = None,
                     runner: Callable[[RunRequest], RunResult] | None = None) -> Comparison:
    """Run the same greedy request with each of ``updaters`` on one device (bundle already deployed):
    the one comparison of updaters there is (the plugin's ``llm.compare`` is this, with ``runner`` its
    own ``generate``, which records what each run gave). ``dump_logits``: None asks the runner
    whether it can (``can_dump_logits``). ``runner``: how one request is run (default: ``run``)."""
    request = base or RunRequest(prompts=[prompt])
    dump = can_dump_logits(device, bundle, mode) if dump_logits is None else dump_logits
    request = replace(request, prompts=[prompt], mode=mode, seq_len=seq_len, temperature=0.0,
                      dump_logits=dump)
    comparison = Comparison(serial=device.serial, mode=mode, prompt=prompt, seq_len=seq_len)
    for updater in updaters:
        one = replace(request, updater=updater)
        comparison.results[updater] = (run(device, bundle, one, timeout=timeout) if runner is None
                                       else runner(one))
    return comparison


def can_dump_logits(device: DeviceLike, bundle: Bundle, mode: str) -> bool:
    """Whether a run of ``mode`` can dump its logits: eval_mode 0 (upstream refuses the flag in any
    other) and a runner that lists --dump_logits_path."""
    return bundle.modes[mode].eval_mode == 0 and takes_flag(device, bundle, "dump_logits_path")
