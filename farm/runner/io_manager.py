"""KV-cache I/O managers: SmartMask and ShiftPointer, with the memory layouts of qnn_llama_runner v1.0.1.

Both present the model with the same (K, V) pairs and the same attention mask, at different places:

SmartMask: one fixed buffer per layer x kv head. A step that produced n entries at absolute position pos
copies them into cache slots [pos, pos+n) (K: one strided copy across the head_dim rows; V: one copy)
and unmasks mask columns [pos, pos+n). On a phone the buffers stay registered with the HTP.

ShiftPointer: entries are right-aligned; the newest sits in column cache_len-1 and the occupied window
grows leftward. K lives in a per-head buffer of (head_dim+1)*cache_len floats and the model's K input is a
zero-copy view of it at offset n_past (a contiguous [head_dim, cache_len] window); the new entries of row
d are written at buffer + cache_len + n_past + d*cache_len, the end of row d in the next window. V's input
is the window at n_past*head_dim; the model's V output belongs right after it, so advancing the offset by
n*head_dim makes the output the last rows of the next input. (The host runtime returns outputs in memory
of its own, so this runner copies V there; on the phone the output tensor is bound to that address.)
Mask columns [cache_len-n_past-n, cache_len-n_past) are set to attend.

Per token the host runner pays these copies in Python, so the hot paths (``inputs``, ``_store``, the
mask update) go through numpy views of the same memory: a numpy slice assignment costs about a
microsecond where torch's indexing costs ten, and a decode step makes ~2 per cache (16 for `small`).
The token and position inputs are buffers filled in place, and SmartMask's cache views are built
once per method. Measured with bench/bench_runner_tokens.py.

Hybrid mode runs a prefill method (ar_len = P) and then a decode method (ar_len = 1): cache_len changes
from max_seq_len-P to max_seq_len-1 and with it K's row stride, so K rows are rearranged once by
``switch_method``; ShiftPointer also moves V, since its windows are right-aligned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from farm.model.llama import MASK_MIN, causal_block
from farm.vocab import Updater


@dataclass(frozen=True)
class KVShape:
    n_layers: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int

    @property
    def n_caches(self) -> int:
        return self.n_layers * self.n_kv_heads


class ContextFull(Exception):
    """The cache has no room for the entries of another step."""


class IoMgr:
    """Shared base: owns the mask, n_past and the current method's ar_len; subclasses own the caches."""

    name: str = "base"

    def __init__(self, shape: KVShape, ar_lens: list[int]):
        self.shape = shape
        self.max_ar_len = max(ar_lens)
        self.min_ar_len = min(ar_lens)
        self.n_past = 0
        self.ar_len = ar_lens[0]
        self._allocate()
        self.mask = self._fresh_mask()
        self._step_buffers()

    # -- what subclasses provide ------------------------------------------------------------------
    def _allocate(self) -> None:
        raise NotImplementedError

    def k_inputs(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def v_inputs(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _store(self, new_k: list[torch.Tensor], new_v: list[torch.Tensor], n: int) -> None:
        """Put the first n entries of this step's outputs into the cache; n_past is not yet advanced."""
        raise NotImplementedError

    def _attend_columns(self, n_past: int, n: int) -> slice:
        """The mask columns of cache entries [n_past, n_past+n)."""
        raise NotImplementedError

    def _rearrange(self, old_cache_len: int, new_cache_len: int) -> None:
        raise NotImplementedError

    # -- the shared protocol ----------------------------------------------------------------------
    @property
    def cache_len(self) -> int:
        return self.shape.max_seq_len - self.ar_len

    def _fresh_mask(self) -> torch.Tensor:
        """The current method's mask: the causal block of the step's tokens, the cached entries open."""
        mask = padded((1, self.ar_len, self.shape.max_seq_len), fill=MASK_MIN)
        mask[0, :, self.cache_len :] = causal_block(self.ar_len)
        if self.n_past:
            mask[0, :, self._attend_columns(0, self.n_past)] = 0.0
        return mask

    def _step_buffers(self) -> None:
        """The token and position inputs of the current method, refilled in place every step."""
        self._tok = torch.zeros((1, self.ar_len), dtype=torch.int32)
        self._pos = torch.zeros((1, self.ar_len), dtype=torch.int32)
        self._tok_np, self._pos_np = self._tok.numpy()[0], self._pos.numpy()[0]
        self._offsets = np.arange(self.ar_len, dtype=np.int32)

    def inputs(self, tokens: list[int], start_pos: int,
               positions: list[int] | None = None) -> list[torch.Tensor]:
        """Model inputs for up to ar_len tokens at absolute positions start_pos..; padded to ar_len.
        ``positions``: each row's own position instead (lookahead decoding: rows that are guesses,
        of which the caller stores a selection and checks the room for it itself).
        The token and position tensors are reused by the next step (the model does not keep them)."""
        n = len(tokens)
        if not 0 < n <= self.ar_len:
            raise ValueError(f"{n} tokens for a method of ar_len {self.ar_len}")
        if start_pos != self.n_past:
            raise ValueError(f"step at position {start_pos} but the cache holds {self.n_past}")
        if positions is None and self.n_past + n > self.cache_len:
            raise ContextFull(f"cache of {self.cache_len} entries has {self.n_past}, {n} more do not fit")
        self._tok_np[:n] = tokens
        self._tok_np[n:] = 0
        # Padding rows get in-range positions; their outputs are ignored and never stored.
        np.minimum(self._offsets + start_pos, self.shape.max_seq_len - 1, out=self._pos_np)
        if positions is not None:
            np.minimum(positions, self.shape.max_seq_len - 1, out=self._pos_np[:n])
        return [self._tok, self.mask, self._pos, *self.k_inputs(), *self.v_inputs()]

    def update(self, outputs: list[torch.Tensor], n: int) -> None:
        """After a step that produced n valid entries: store them and unmask their columns."""
        m = self.shape.n_caches
        new_k, new_v = outputs[1 : 1 + m], outputs[1 + m : 1 + 2 * m]
        if self.n_past + n > self.cache_len:
            raise ContextFull(f"cache of {self.cache_len} entries is full")
        self._store(new_k, new_v, n)
        self.mask.numpy()[0, :, self._attend_columns(self.n_past, n)] = 0.0
        self.n_past += n

    def switch_method(self, ar_len: int) -> None:
        """Move from the prefill method to the decode method (or back): new cache_len, same entries."""
        if ar_len == self.ar_len:
            return
        if self.n_past > self.shape.max_seq_len - ar_len:
            raise ContextFull(f"{self.n_past} cached entries do not fit a method of ar_len {ar_len}")
        old = self.cache_len
        self.ar_len = ar_len
        self._rearrange(old, self.cache_len)
        self.mask = self._fresh_mask()
        self._step_buffers()

    def set_step_block(self, block: torch.Tensor) -> None:
        """The mask among the current method's own rows (default: causal), e.g. lookahead's tree."""
        self.mask[0, :, self.cache_len :] = block

    def reset(self) -> None:
        self.n_past = 0
        self.mask = self._fresh_mask()

    # For tests and diagnostics: the cached K/V entries of one head in position order, whatever the layout.
    def cached_k(self, head: int) -> torch.Tensor:
        """[head_dim, n_past]"""
        return self.k_inputs()[head][0][:, self._attend_columns(0, self.n_past)]

    def cached_v(self, head: int) -> torch.Tensor:
        """[n_past, head_dim]"""
        return self.v_inputs()[head][0][self._attend_columns(0, self.n_past)]


# The programs read their inputs where the runner keeps them (farm/bundle/export.py program_bytes),
# and XNNPACK may read up to 16 bytes past the end of an array it is given (XNN_EXTRA_BYTES in
# xnnpack.h): every buffer an input is a view of ends that far before its allocation does.
XNNPACK_SLACK_BYTES = 16


def padded(shape: tuple[int, ...], fill: float = 0.0) -> torch.Tensor:
    """A float32 tensor of ``shape`` filled with ``fill``, its allocation XNNPACK_SLACK_BYTES longer."""
    n = math.prod(shape)
    return torch.full((n + XNNPACK_SLACK_BYTES // 4,), fill)[:n].view(shape)


class SmartMaskIoMgr(IoMgr):
    name = Updater.SMART_MASK

    def _allocate(self) -> None:
        s = self.shape
        biggest = s.max_seq_len - self.min_ar_len
        # One fixed buffer per cache (rows of one allocation, so that a step's store is one copy).
        self._k_all = padded((s.n_caches, s.head_dim * biggest))
        self._v_all = padded((s.n_caches, biggest * s.head_dim))
        self.k_buf, self.v_buf = list(self._k_all.unbind(0)), list(self._v_all.unbind(0))

    # The buffers never move: their views are built once per cache_len (i.e. per method).
    def k_inputs(self) -> list[torch.Tensor]:
        return self._views(self.cache_len)[0]

    def v_inputs(self) -> list[torch.Tensor]:
        return self._views(self.cache_len)[1]

    def _views(self, cl: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        cached = getattr(self, "_view_cache", None)
        if cached is None or cached[0] != cl:
            hd = self.shape.head_dim
            cached = self._view_cache = (cl, [b[: hd * cl].view(1, hd, cl) for b in self.k_buf],
                                         [b[: cl * hd].view(1, cl, hd) for b in self.v_buf])
        return cached[1], cached[2]

    def _attend_columns(self, n_past: int, n: int) -> slice:
        return slice(n_past, n_past + n)

    def _store(self, new_k, new_v, n) -> None:
        pos, cl, hd, m = self.n_past, self.cache_len, self.shape.head_dim, self.shape.n_caches
        # Every cache at once: K columns pos..pos+n of each [head_dim, cl] view, V rows pos..pos+n.
        self._k_all[:, : hd * cl].view(m, hd, cl)[:, :, pos : pos + n] = torch.stack(new_k)[:, 0, :, :n]
        self._v_all[:, pos * hd : (pos + n) * hd] = torch.stack(new_v)[:, 0, :n].reshape(m, n * hd)

    def _rearrange(self, old_cache_len: int, new_cache_len: int) -> None:
        hd, n = self.shape.head_dim, self.n_past
        for b in self.k_buf:
            kept = b[: hd * old_cache_len].view(hd, old_cache_len)[:, :n].clone()
            b[: hd * new_cache_len].view(hd, new_cache_len)[:, :n] = kept
        # V rows keep their stride (head_dim): the first n rows are already where the new view reads.


class ShiftPointerIoMgr(IoMgr):
    name = Updater.SHIFT_POINTER

    def _allocate(self) -> None:
        s = self.shape
        biggest = s.max_seq_len - self.min_ar_len
        # One buffer per cache (rows of one allocation: a step's windows are one as_strided call).
        self._k_all = padded((s.n_caches, (s.head_dim + 1) * biggest))
        # Window (cache_len rows) at n_past, then the step's output rows right after it.
        self._v_all = padded((s.n_caches, (2 * biggest + self.max_ar_len) * s.head_dim))
        self.k_buf, self.v_buf = list(self._k_all.unbind(0)), list(self._v_all.unbind(0))

    def k_inputs(self) -> list[torch.Tensor]:
        cl, hd, m = self.cache_len, self.shape.head_dim, self.shape.n_caches
        # The pointer moves, the data does not: in each cache's buffer, a contiguous window starting
        # at element n_past.
        return list(self._k_all.as_strided((m, 1, hd, cl), (self._k_all.stride(0), hd * cl, cl, 1),
                                           self._k_all.storage_offset() + self.n_past).unbind(0))

    def v_inputs(self) -> list[torch.Tensor]:
        cl, hd, m = self.cache_len, self.shape.head_dim, self.shape.n_caches
        return list(self._v_all.as_strided((m, 1, cl, hd), (self._v_all.stride(0), cl * hd, hd, 1),
                                           self._v_all.storage_offset() + self.n_past * hd).unbind(0))

    def _attend_columns(self, n_past: int, n: int) -> slice:
        cl = self.cache_len
        return slice(cl - n_past - n, cl - n_past)

    def _store(self, new_k, new_v, n) -> None:
        cl, hd, p, m = self.cache_len, self.shape.head_dim, self.n_past, self.shape.n_caches
        # Row d's n new entries at p + (d+1)*cl: the tail of row d in the window at p+n. Seen as rows
        # of cl elements, that is rows 1..hd, columns p..p+n (p + n <= cl); every cache at once.
        k_rows = self._k_all[:, : (hd + 1) * cl].view(m, hd + 1, cl)
        k_rows[:, 1:, p : p + n] = torch.stack(new_k)[:, 0, :, :n]
        self._v_all[:, (p + cl) * hd : (p + cl + n) * hd] = \
            torch.stack(new_v)[:, 0, :n].reshape(m, n * hd)

    def _rearrange(self, old_cache_len: int, new_cache_len: int) -> None:
        hd, n = self.shape.head_dim, self.n_past
        if n == 0:
            return
        # With the window at n_past, row d's valid entries sit at [(d+1)*cl, (d+1)*cl + n_past) and
        # V's valid rows at [cl, cl + n_past): both move with cache_len.
        for kb in self.k_buf:  # (as_strided's offset counts from the start of the allocation)
            base = kb.storage_offset()
            kept = kb.as_strided((hd, n), (old_cache_len, 1), base + old_cache_len).clone()
            kb.as_strided((hd, n), (new_cache_len, 1), base + new_cache_len).copy_(kept)
        for vb in self.v_buf:
            kept = vb[old_cache_len * hd : (old_cache_len + n) * hd].clone()
            vb[new_cache_len * hd : (new_cache_len + n) * hd] = kept


UPDATERS: dict[Updater, type[IoMgr]] = {cls.name: cls for cls in (SmartMaskIoMgr, ShiftPointerIoMgr)}
