"""The logits a runner dumps with ``--dump_logits_path``: upstream's layout, and reading it back.

qnn_llama_runner v1.0.1 (runner/runner.cpp save_logits, RUN:66-83 and 456-460) rewrites the file after
every prompt's generate call with every logits row it has kept so far: first all the prompt
processor's rows (prompt_processor.cpp:313-317: each prefill step's whole ``[ar_len, vocab]`` output,
padding rows of a last partial chunk included), then all the token generator's rows
(token_generator.cpp:284-288: ``ar_len`` rows per decode step). Both lists grow over prompts and
iterations and are never cleared, so after several prompts the file holds every prompt's prefill
rows, then every prompt's decode rows. Upstream allows the flag with ``--eval_mode 0`` only
(qnn_llama_runner.cpp:247-251), where both methods are ``forward`` with ar_len 1: one row per prompt
token, then one row per decode step (the prefill's first token has no row of its own: it is sampled
from the last prompt row).

The values are the model's logits output, raw: on a phone the QNN model's quantized uint16 (the
reader's ``scale``/``zero_point`` dequantize as llama.py's decoder_utils does: ``(q - zero_point) *
scale``; the file carries neither). The host runner's model computes float32 logits and writes them
as they are, little-endian float32 (``HOST_DTYPE``), in the same layout: quantizing them with an
invented scale would only hide differences. So a dump's dtype follows from the runner that wrote it
(``dtype_for``), never from the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

HOST_DTYPE = np.dtype("<f4")  # farm-llama-runner: the model's float32 logits
DEVICE_DTYPE = np.dtype("<u2")  # qnn_llama_runner: the QNN model's quantized uint16 logits


class LogitsDumpError(ValueError):
    """A dump that cannot be read as the caller describes it (the message names the file)."""


def dtype_for(host_runner: bool) -> np.dtype:
    """The element type of a dump: the host runner's float32, a QNN runner's uint16."""
    return HOST_DTYPE if host_runner else DEVICE_DTYPE


def dump_bytes(prefill_rows: list[np.ndarray], decode_rows: list[np.ndarray]) -> bytes:
    """The file's content (what the host runner writes): prefill rows, then decode rows, as float32."""
    rows = [np.asarray(r, dtype=HOST_DTYPE).reshape(-1) for r in (*prefill_rows, *decode_rows)]
    return b"".join(r.tobytes() for r in rows)


def read_logits_dump(path: str | Path, *, vocab_size: int | None = None, n_rows: int | None = None,
                     dtype: np.dtype | str = HOST_DTYPE, scale: float | None = None,
                     zero_point: float = 0.0) -> np.ndarray:
    """A dump as ``[rows, vocab]``: float32 as written for the host's dtype; a quantized dump
    dequantized when ``scale`` is given (else its raw integers). Give ``vocab_size``, or ``n_rows``
    (e.g. prompt_tokens + generated_tokens of every prompt so far, from the observer lines, in
    eval_mode 0) to infer it."""
    dtype = np.dtype(dtype)
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LogitsDumpError(f"{path}: cannot read the logits dump: {e.strerror}") from None
    if len(raw) % dtype.itemsize:
        raise LogitsDumpError(f"{path}: {len(raw)} bytes is not a whole number of {dtype.name} values")
    values = np.frombuffer(raw, dtype=dtype)
    if vocab_size is None:
        if not n_rows or n_rows < 0:
            raise LogitsDumpError(f"{path}: give vocab_size or a positive n_rows to read the dump")
        if len(values) % n_rows:
            raise LogitsDumpError(f"{path}: {len(values)} {dtype.name} values do not make {n_rows} "
                                  f"rows of one vocabulary")
        vocab_size = len(values) // n_rows
    if vocab_size <= 0 or len(values) % vocab_size:
        raise LogitsDumpError(f"{path}: {len(values)} {dtype.name} values are not whole rows of a "
                              f"{vocab_size}-token vocabulary")
    rows = values.reshape(-1, vocab_size)
    if n_rows is not None and len(rows) != n_rows:
        raise LogitsDumpError(f"{path}: {len(rows)} rows of {vocab_size} logits, expected {n_rows}")
    if scale is not None:
        return (rows.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
    return rows


def read_logits_bytes(result) -> np.ndarray:
    """A run's dump (``RunResult.logits``, of ``RunResult.logits_dtype``) as ``[rows, vocab]``: in
    eval_mode 0 one row per prompt token and decode step, so prompt_tokens + generated_tokens of
    its observer lines give the row count."""
    dtype = np.dtype(result.logits_dtype or HOST_DTYPE)
    n_rows = sum(o.get("prompt_tokens", 0) + o.get("generated_tokens", 0) for o in result.observers)
    raw = result.logits or b""
    where = f"logits of the {result.updater} run on {result.serial}"
    if len(raw) % dtype.itemsize or not n_rows or len(raw) // dtype.itemsize % n_rows:
        raise LogitsDumpError(f"{where}: {len(raw)} bytes are not {n_rows} whole rows of {dtype.name} "
                              f"(prompt_tokens + generated_tokens of its observer lines)")
    return np.frombuffer(raw, dtype=dtype).reshape(n_rows, -1)


@dataclass(frozen=True)
class LogitsDiff:
    """How two dumps of the same run differ: identical inputs must give identical logits, up to the
    rounding of a different summation order (the two KV layouts attend over the same entries in
    other positions: 1 ulp at the reference model's ~1e4 logits, where its argmax margin can be
    0.0016). Distances are in units in the last place of the dump's type (for a quantized dump, its
    steps), so one tolerance fits logits of any size."""

    rows_compared: int
    max_abs_diff: float  # over the rows compared
    first_differing_row: int | None  # the first row with a difference over the tolerance; None if none
    rows: tuple[int, int]  # each dump's row count: a different count is a difference too
    max_ulp: int = 0  # the largest distance in ulp (a quantized dump: steps) over the rows compared
    first_changed_row: int | None = None  # the first row with any difference at all
    tolerance_ulp: int = 0  # what first_differing_row was judged with

    @property
    def identical(self) -> bool:
        return self.first_differing_row is None and self.rows[0] == self.rows[1]


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise distance of two ``[rows, vocab]`` dumps (int64) in units in the last place of
    each row's largest logit: the rounding of a different summation order scales with the row's
    magnitude, not with each element's (a 0.001 difference beside a 1e4 logit is 1 ulp there, and
    millions of ulp of a logit near 0). For an integer (quantized) dump, the difference in steps.
    A NaN on one side only is the largest distance, NaN on both none."""
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return np.abs(a.astype(np.int64) - b.astype(np.int64))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        scale = np.fmax(np.nanmax(np.abs(a64), axis=1, initial=0.0),
                        np.nanmax(np.abs(b64), axis=1, initial=0.0))
        unit = np.spacing(scale.astype(np.float32)).astype(np.float64)[:, None]
        dist = np.nan_to_num(np.abs(a64 - b64) / unit, nan=0.0, posinf=np.inf)
    big = float(np.iinfo(np.int64).max // 2)
    dist = np.ceil(np.minimum(dist, big)).astype(np.int64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    dist[nan_a != nan_b] = np.iinfo(np.int64).max
    dist[nan_a & nan_b] = 0
    return dist


def diff_logits(a: np.ndarray, b: np.ndarray, tolerance: float = 0.0,
                tolerance_ulp: int = 0) -> LogitsDiff:
    """Compare two ``[rows, vocab]`` dumps row by row, over the rows both have. An element differs
    when it is more than ``tolerance`` apart and more than ``tolerance_ulp`` ulp apart."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise LogitsDumpError(f"logits of shapes {a.shape} and {b.shape} cannot be compared")
    n = min(len(a), len(b))
    if n == 0:
        return LogitsDiff(0, 0.0, None, (len(a), len(b)), tolerance_ulp=tolerance_ulp)
    diff = np.abs(a[:n].astype(np.float64) - b[:n].astype(np.float64))
    diff[np.isnan(diff)] = np.inf  # a NaN on one side only is a difference, NaN on both is not
    diff[np.isnan(a[:n]) & np.isnan(b[:n])] = 0.0
    ulps = ulp_distance(a[:n], b[:n])
    over = np.flatnonzero(((diff > tolerance) & (ulps > tolerance_ulp)).any(axis=1))
    changed = np.flatnonzero((ulps > 0).any(axis=1))
    return LogitsDiff(n, float(diff.max()), int(over[0]) if len(over) else None, (len(a), len(b)),
                      max_ulp=int(ulps.max()), first_changed_row=int(changed[0]) if len(changed) else None,
                      tolerance_ulp=tolerance_ulp)
