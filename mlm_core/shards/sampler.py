"""Which (language, row) each training sample comes from: stratified, seeded, resumable, rank-disjoint.

In: rows per language, p(l) (the shards manifest's sampling table, p ∝ n_l^α), a seed, rank and world size.
Out: an infinite stream of draws; draw g of the global stream is a pure function of (seed, g), so a
sampler can jump anywhere, its state is one integer, and rank r of W takes global draws r, r+W, r+2W, ...
(the union over ranks is exactly the single-process stream; no two ranks share a draw).

Language choice (stratified, not i.i.d.): the stream is cut into blocks of about ``block`` draws. Language
l's cumulative quota after k blocks is A_l(k) = floor(k·block·p_l + φ_l) (φ_l a seeded offset in [0,1)),
so block k holds A_l(k+1) - A_l(k) draws of l, shuffled within the block by a permutation seeded by
(seed, k). After any whole number of blocks each language's count is within 1 of its expectation, so
shares match p(l) to about (languages + block) / draws -- unlike i.i.d. draws, whose error only shrinks
as 1/sqrt(draws). A language with tiny p still gets its share (once every 1/(block·p) blocks).

Row choice: the j-th draw of language l is row perm(seed, l, e)[j mod n_l] with e = j div n_l: each
language is consumed as a sequence of seeded permutations of its rows, so within an epoch of a language
no row repeats (without replacement), and upsampled languages cycle through fresh permutations. That e is
the draw's *pass* over its language (how many times the sampler went through all of that language's rows
before it): ``draws(..., passes=True)`` returns it too (static masking cycles its k masks by it).
"""
from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

STATE_VERSION = 1
_U64 = 2**64


def _rng(*words: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) % _U64 for w in words])))


class LanguageSampler:
    """Deterministic language-then-row sampler; see the module docstring."""

    def __init__(self, rows_per_lang: dict[str, int], probs: dict[str, float], seed: int, rank: int = 0,
                 world_size: int = 1, block: int = 256):
        langs = sorted(lang for lang in probs if probs[lang] > 0)
        if not langs:
            raise ValueError("no language with p > 0")
        missing = [lang for lang in langs if rows_per_lang.get(lang, 0) <= 0]
        if missing:
            raise ValueError(f"language(s) {missing} have p > 0 but no rows")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if block < 1:
            raise ValueError("block must be >= 1")
        p = np.array([probs[lang] for lang in langs], dtype=np.float64)
        self.langs = langs
        self.p = p / p.sum()
        self.rows = np.array([int(rows_per_lang[lang]) for lang in langs], dtype=np.int64)
        self.seed, self.rank, self.world_size, self.block = int(seed), int(rank), int(world_size), int(block)
        self._phi = _rng(self.seed, 1).random(len(langs))
        self._tags = [zlib.crc32(lang.encode()) for lang in langs]
        self.step = 0                                   # draws this rank has taken
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._perms: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    # --- the global stream, as pure functions of the draw index
    def _quota(self, k: np.ndarray) -> np.ndarray:
        """A_l(k) for blocks k: (len(k), L) cumulative draws of each language before block k."""
        k = np.asarray(k, dtype=np.float64).reshape(-1, 1)
        return np.floor(k * self.block * self.p + self._phi).astype(np.int64)

    def _block_start(self, k: np.ndarray) -> np.ndarray:
        return self._quota(k).sum(axis=1)

    def _block_of(self, g: np.ndarray) -> np.ndarray:
        """k with start(k) <= g < start(k+1); start(k) is within L of k*block, so a few corrections suffice."""
        k = g // self.block
        for _ in range(len(self.langs) + 2):
            lo = self._block_start(k) > g
            k = k - lo
            hi = self._block_start(k + 1) <= g
            k = k + hi
            if not (lo.any() or hi.any()):
                return k
        raise RuntimeError("sampler: block search did not converge")  # pragma: no cover

    def _block(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(language index per position, occurrence index of that language per position) for block k."""
        hit = self._blocks.get(k)
        if hit is not None:
            return hit
        q = self._quota(np.array([k, k + 1]))
        counts = q[1] - q[0]
        seq = np.repeat(np.arange(len(self.langs)), counts)
        seq = seq[_rng(self.seed, 2, k).permutation(len(seq))]
        occ = np.empty(len(seq), dtype=np.int64)
        for li in range(len(self.langs)):
            where = np.flatnonzero(seq == li)
            occ[where] = q[0, li] + np.arange(len(where))
        self._blocks[k] = (seq, occ)
        if len(self._blocks) > 8:
            self._blocks.popitem(last=False)
        return seq, occ

    def _perm(self, li: int, epoch: int) -> np.ndarray:
        key = (li, epoch)
        hit = self._perms.get(key)
        if hit is None:
            n = int(self.rows[li])
            hit = _rng(self.seed, 3, self._tags[li], epoch).permutation(n).astype(np.int32 if n < 2**31 else np.int64)
            self._perms[key] = hit
            if len(self._perms) > 2 * len(self.langs):
                self._perms.popitem(last=False)
        return hit

    def draws(self, g, passes: bool = False) -> tuple[np.ndarray, ...]:
        """(language index, row) of global draws ``g`` (any int array): the stream all ranks share; with
        ``passes`` also each draw's pass over its language (e = occurrence div rows: 0 on the first pass)."""
        g = np.asarray(g, dtype=np.int64).reshape(-1)
        k = self._block_of(g)
        li = np.empty(len(g), dtype=np.int64)
        occ = np.empty(len(g), dtype=np.int64)
        starts = self._block_start(k)
        for kb in np.unique(k):
            sel = k == kb
            seq, o = self._block(int(kb))
            pos = g[sel] - starts[sel]
            li[sel], occ[sel] = seq[pos], o[pos]
        rows = np.empty(len(g), dtype=np.int64)
        epoch, j = occ // self.rows[li], occ % self.rows[li]
        for lang_i, e in set(zip(li.tolist(), epoch.tolist())):
            sel = (li == lang_i) & (epoch == e)
            rows[sel] = self._perm(lang_i, e)[j[sel]]
        return (li, rows, epoch) if passes else (li, rows)

    # --- this rank's view
    def next_indices(self, batch_size: int, passes: bool = False) -> tuple[np.ndarray, ...]:
        """The next ``batch_size`` draws of this rank as (language index into ``self.langs``, row) arrays (and
        their passes, with ``passes``)."""
        g = self.rank + self.world_size * (self.step + np.arange(batch_size, dtype=np.int64))
        self.step += batch_size
        return self.draws(g, passes)

    def next_batch(self, batch_size: int) -> list[tuple[str, int]]:
        li, rows = self.next_indices(batch_size)
        return [(self.langs[i], int(r)) for i, r in zip(li.tolist(), rows.tolist())]

    def __iter__(self):
        while True:
            for item in self.next_batch(1024):
                yield item

    # --- checkpointing
    def state_dict(self) -> dict:
        """JSON-serializable. ``consumed`` (global draws taken by all ranks, assuming they move in step) lets a
        run resume with a different world size when it divides ``consumed``."""
        return {"version": STATE_VERSION, "seed": self.seed, "block": self.block, "langs": list(self.langs),
                "rows": self.rows.tolist(), "p": self.p.tolist(), "rank": self.rank,
                "world_size": self.world_size, "step": self.step, "consumed": self.step * self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')} != {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("seed", "block", "langs", "rows"):
            if state[key] != mine[key]:
                raise ValueError(f"sampler state does not match this sampler: {key} {state[key]} != {mine[key]}")
        if not np.allclose(state["p"], mine["p"], rtol=0, atol=1e-12):
            raise ValueError(f"sampler state does not match this sampler: p {state['p']} != {mine['p']}")
        if state["world_size"] == self.world_size:
            self.step = int(state["step"])
        elif state["consumed"] % self.world_size == 0:
            self.step = int(state["consumed"]) // self.world_size
        else:
            raise ValueError(f"cannot resume {state['consumed']} consumed draws on world_size {self.world_size}: "
                             f"not a multiple")
