"""The I/O of a program in ExecuTorch 1.4.1's static-llama layout, as qnn_llama_runner v1.4.1 drives it.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/runner/: RUN = runner.cpp, KVM =
kv_manager.cpp, PP = prompt_processor.cpp, TG = token_generator.cpp.

A program of this layout (farm/bundle/export_v14.py) has methods ``kv_forward`` (kv mode, and the token
generator of hybrid and lookahead) and ``prefill_forward`` (their prompt processor), RUN:163-181. Its
inputs are tokens [1, AR], the attention mask [1, 1, AR, CL], input_pos [1, AR], then one k cache
[1, H, D, CL - AR] per layer and one v cache [1, H, CL - AR, D] per layer; its outputs the logits
[1, AR, vocab] and the new k [1, H, D, AR] / v [1, H, AR, D] of each layer. The runner reads the shape of
the model from the methods (RUN:216-265): vocab from output 0's sizes[2], H and D from output 1 (the
first new k), AR and CL from input 1 (the mask), n_layers from ``get_n_layers``; the cache buffers
hold max_cache_len = CL - min(AR of the two methods) entries (RUN:260-264).

SmartMask (the only updater 1.4.1 has) keeps one k and one v buffer per layer. A step that produced n
entries at position p copies them into columns [p, p+n) of every k row (KVM:378-420, one copy per
head x head_dim row) and rows [p, p+n) of every head's v block (KVM:422-469), and opens mask columns
[p, p+n) in every row (KVM:230-242). Switching methods changes cache_len = CL - AR, the stride of k's
rows and of v's head blocks, so both are rearranged (KVM:284-360). A float mask is 0 to attend and
-65535 to mask (KVM:19-64).
"""

from __future__ import annotations

import numpy as np
import torch

from farm.errors import UsageError
from farm.runner.io_manager import ContextFull, IoMgr, KVShape, padded
from farm.vocab import Updater

# --eval_mode -> (prompt processor's method, token generator's method), RUN:165-181.
METHODS = {0: ("kv_forward", "kv_forward"), 1: ("prefill_forward", "kv_forward"),
           2: ("prefill_forward", "kv_forward")}
MASKED = -65535.0  # KVM:50-54: the float mask's "very negative" value
MASK_INPUT = 1  # RUN:246-249: the attention mask is input 1
K_OUTPUT = 1  # RUN:233-236: the first new k is output 1


def is_v14(program) -> bool:
    """Whether an ``executorch.runtime`` Program has 1.4.1's layout: its ``kv_forward`` takes a 4-D mask
    (v1.0.1's takes [1, AR, CL], and its kv program has a ``forward`` instead)."""
    if "kv_forward" not in program.method_names:
        return False
    return len(program.metadata("kv_forward").input_tensor_meta(MASK_INPUT).sizes()) == 4


def read_shape(program, decode_meta, n_layers: int) -> tuple[KVShape, int]:
    """(the caches' shape, vocab size) as RUN:221-249 reads them: vocab and n_heads/head_dim from the
    token generator's outputs, the context from its mask; ``max_seq_len`` is the context length CL."""
    k = decode_meta.output_tensor_meta(K_OUTPUT).sizes()
    mask = decode_meta.input_tensor_meta(MASK_INPUT).sizes()
    vocab = decode_meta.output_tensor_meta(0).sizes()[2]
    return KVShape(n_layers=n_layers, n_kv_heads=k[1], head_dim=k[2], max_seq_len=mask[3]), vocab


def ar_len(method) -> int:
    """A method's AR length: its mask's sizes[2] (RUN:248, 258)."""
    return method.metadata.input_tensor_meta(MASK_INPUT).sizes()[2]


def check_inputs(decode_meta, shape: KVShape, where: str) -> str | None:
    """Why the token generator's inputs are not the layout's (tokens, mask, input_pos, a k and a v
    cache per layer), or None."""
    expected = 3 + 2 * shape.n_layers
    if decode_meta.num_inputs() != expected:
        return (f"{where} has {decode_meta.num_inputs()} inputs, 1.4.1's static llama layout with "
                f"{shape.n_layers} layers needs {expected}")
    return None


def updater_for(io_mgr_cls: type[IoMgr]) -> type[IoMgr]:
    """The updater of a 1.4.1-layout program for the one asked (--kv_updater): SmartMask, the only one
    1.4.1 has (ShiftPointer was removed in v1.1.0, PR #15438). A subclass of SmartMaskV14 is taken as it
    is (a test's variant)."""
    if issubclass(io_mgr_cls, SmartMaskV14):
        return io_mgr_cls
    if io_mgr_cls.name != Updater.SMART_MASK:
        raise UsageError(f"--kv_updater: {io_mgr_cls.name} cannot update a program of ExecuTorch "
                         "1.4.1's layout (one cache per layer): its runner has SmartMask only")
    return SmartMaskV14


class SmartMaskV14(IoMgr):
    """SmartMask over one k and one v cache per layer (KVM), in the IoMgr protocol the engine drives:
    ``inputs`` gives the method's inputs, ``update`` stores a step's outputs, ``switch_method``
    rearranges for another AR length."""

    name = Updater.SMART_MASK

    @property
    def n_layers(self) -> int:
        return self.shape.n_layers

    def _allocate(self) -> None:
        s = self.shape
        # KVM:270-282: per layer, a k and a v buffer of n_heads * head_dim * max_cache_len values
        # (rows of one allocation each, so that a step's store is one copy for all layers).
        self.max_cache_len = s.max_seq_len - self.min_ar_len
        size = s.n_kv_heads * s.head_dim * self.max_cache_len
        self._k_all = padded((s.n_layers, size))  # XNNPACK's read slack after them (io_manager)
        self._v_all = padded((s.n_layers, size))

    def _views(self, cl: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers' caches as the method of cache_len ``cl`` reads them: k [L, H, D, cl], v
        [L, H, cl, D], at the start of each layer's buffer (the input tensors' data pointers)."""
        s = self.shape
        n = s.n_kv_heads * s.head_dim * cl
        return (self._k_all[:, :n].view(s.n_layers, s.n_kv_heads, s.head_dim, cl),
                self._v_all[:, :n].view(s.n_layers, s.n_kv_heads, cl, s.head_dim))

    def k_inputs(self) -> list[torch.Tensor]:
        cached = getattr(self, "_input_cache", None)
        if cached is None or cached[0] != self.cache_len:
            k, v = self._views(self.cache_len)
            cached = self._input_cache = (self.cache_len, [t.unsqueeze(0) for t in k.unbind(0)],
                                          [t.unsqueeze(0) for t in v.unbind(0)])
        return cached[1]

    def v_inputs(self) -> list[torch.Tensor]:
        self.k_inputs()
        return self._input_cache[2]

    def _attend_columns(self, n_past: int, n: int) -> slice:
        return slice(n_past, n_past + n)

    def _fresh_mask(self) -> torch.Tensor:
        """KVM:107-158 with the causal attention map (PP:288-292, TG:239-255): every row attends the
        n_past cached entries, and the step's rows themselves causally in the last AR columns."""
        cl = self.shape.max_seq_len
        mask = padded((1, 1, self.ar_len, cl), fill=MASKED)
        mask[0, 0, :, : self.n_past] = 0.0
        rows = np.arange(self.ar_len)
        mask.numpy()[0, 0, :, cl - self.ar_len :][rows[None, :] <= rows[:, None]] = 0.0
        return mask

    def update(self, outputs: list[torch.Tensor], n: int) -> None:
        """KVM update_cache then update_attention_mask (PP:351-356, TG:321-326) for the first n rows
        of a step."""
        new_k, new_v = outputs[1 : 1 + self.n_layers], outputs[1 + self.n_layers : 1 + 2 * self.n_layers]
        self._store(new_k, new_v, n)
        self.mask.numpy()[0, 0, :, self._attend_columns(self.n_past, n)] = 0.0
        self.n_past += n

    def _store(self, new_k, new_v, n) -> None:
        pos, cl = self.n_past, self.cache_len
        if pos + n > cl:
            raise ContextFull(f"cache of {cl} entries is full")
        k, v = self._views(cl)
        # KVM:393-399: every (head, head_dim) row of k gets n columns at pos; KVM:442-449: every
        # head's v block gets n rows at pos.
        k[:, :, :, pos : pos + n] = torch.stack(new_k)[:, 0, :, :, :n]
        v[:, :, pos : pos + n, :] = torch.stack(new_v)[:, 0, :, :n, :]

    def keep_rows(self, outputs: list[torch.Tensor], rows: list[int]) -> None:
        """Lookahead: cache the entries of the rows sampled, in order (KVM update_cache with
        ``selected``, KVM:400-419 and 450-468)."""
        index = torch.tensor(rows)
        m = self.n_layers
        new_k = [k.index_select(3, index) for k in outputs[1 : 1 + m]]
        new_v = [v.index_select(2, index) for v in outputs[1 + m : 1 + 2 * m]]
        self.update([outputs[0], *new_k, *new_v], len(rows))

    def _rearrange(self, old_cache_len: int, new_cache_len: int) -> None:
        # KVM:296-360: k's H*D rows and v's H blocks move to the new stride (memmove, in the order
        # that never overwrites what is still to be read). Only the first n_past entries matter.
        # Past the context (the attention sink) n_past may exceed the new cache_len: the rows keep
        # their first new_cache_len entries (KVM:301-309 copies dst_cache_num of each), the rest is lost.
        n = min(self.n_past, new_cache_len)
        old_k, old_v = self._views(old_cache_len)
        kept_k, kept_v = old_k[..., :n].clone(), old_v[:, :, :n].clone()
        new_k, new_v = self._views(new_cache_len)
        new_k[..., :n] = kept_k
        new_v[:, :, :n] = kept_v
        self._input_cache = None

    def switch_method_past_context(self, ar_len: int) -> None:
        """switch_method as rearrange_cache does it (KVM:284-294) also when the entries do not fit the
        new method's cache: with the attention sink a prefill after a long generation rearranges a
        full decode cache into the prefill's shorter one (its tail lost), then evicts (PP:286-332)."""
        if ar_len == self.ar_len:
            return
        old = self.cache_len
        self.ar_len = ar_len
        self._rearrange(old, self.cache_len)
        self.mask = self._fresh_mask()
        self._step_buffers()

    def evicted(self, n: int) -> None:
        """After the evictor ran on the caches: shifted_pos -= eviction_batch_size and the mask
        initialised at it (PP:318-322, TG:282-286; init_attention_mask opens columns [0, shifted_pos)
        and the causal block). A lookahead caller sets its own block again (LHD:261)."""
        self.n_past -= n
        self.mask = self._fresh_mask()

    def caches(self) -> list[torch.Tensor]:
        """The cache inputs of the current method, k per layer then v per layer (PP:138-163): what
        the evictor takes and writes (ASR set_outputs)."""
        return [*self.k_inputs(), *self.v_inputs()]

    def set_step_block(self, block: torch.Tensor) -> None:
        """The mask among the step's own rows (0 = attend), e.g. lookahead's attention map (KVM:107-158
        with a map other than the causal one), written in this layout's masked value."""
        values = torch.where(block < 0, torch.tensor(MASKED), torch.tensor(0.0))
        self.mask[0, 0, :, self.cache_len :] = values

    def cached_k(self, head: int) -> torch.Tensor:
        """[head_dim, n_past] of cache ``head`` = layer * n_kv_heads + kv head (IoMgr's numbering)."""
        layer, h = divmod(head, self.shape.n_kv_heads)
        return self.k_inputs()[layer][0, h][:, : self.n_past]

    def cached_v(self, head: int) -> torch.Tensor:
        """[n_past, head_dim]"""
        layer, h = divmod(head, self.shape.n_kv_heads)
        return self.v_inputs()[layer][0, h][: self.n_past]
