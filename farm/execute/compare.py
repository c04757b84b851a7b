"""The updater comparison: SmartMask and ShiftPointer must produce identical tokens at temperature 0.

Upstream has no test comparing the two updaters; this is the farm's own correctness check. It compares
token ids when the runner writes them (the host runner does) and the output text bytes otherwise (a
stock qnn_llama_runner writes only outputs.txt). Two empty outputs (no text, or no generated token
ids) are never an agreement: a runner that produced nothing has not shown anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from farm.bundle.manifest import Bundle
from farm.device.protocol import DeviceLike
from farm.execute.run import RunResult, run
from farm.execute.runprofile import RunRequest
from farm.vocab import Updater

UPDATER_PAIR: tuple[Updater, Updater] = (Updater.SMART_MASK, Updater.SHIFT_POINTER)


@dataclass
class Comparison:
    serial: str
    mode: str
    prompt: str
    seq_len: int
    results: dict[str, RunResult] = field(default_factory=dict)

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
    def agree(self) -> bool:
        if self._missing() or self._empty():
            return False  # nothing produced is never an agreement
        seqs = list(self._sequences().values())
        return len(seqs) == len(UPDATER_PAIR) and all(s == seqs[0] for s in seqs)

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
        if self.agree:
            n = len(self._sequences()[UPDATER_PAIR[0]])
            return f"{' and '.join(UPDATER_PAIR)} agree on {n} {self.compared_by.split()[-1]}"
        i = self.first_divergence()
        a, b = (self._sequences()[u] for u in UPDATER_PAIR)
        return (f"{UPDATER_PAIR[0]} and {UPDATER_PAIR[1]} diverge at {self.compared_by} index {i} "
                f"{where}: {a[i:i + 5]!r} vs {b[i:i + 5]!r}")

    def tok_s(self) -> dict[str, float | None]:
        return {u: r.tokens_per_s for u, r in self.results.items()}


def compare_updaters(device: DeviceLike, bundle: Bundle, *, mode: str, prompt: str, seq_len: int,
                     timeout: float = 600.0, base: RunRequest | None = None) -> Comparison:
    """Run the same greedy request with both updaters on one device (bundle already deployed)."""
    request = base or RunRequest(prompts=[prompt])
    request = replace(request, prompts=[prompt], mode=mode, seq_len=seq_len, temperature=0.0)
    comparison = Comparison(serial=device.serial, mode=mode, prompt=prompt, seq_len=seq_len)
    for updater in UPDATER_PAIR:
        comparison.results[updater] = run(device, bundle, replace(request, updater=updater),
                                          timeout=timeout)
    return comparison
