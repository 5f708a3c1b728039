"""Why a prefix-cache miss missed: what the simulator knows and vLLM does not.

vLLM counts prefix-cache queries and hits in tokens; its residency histograms
(``--kv-cache-metrics``) count sampled blocks as they are evicted, without the request
or conversation that held them. The simulated engine keeps the block hashes it evicted
and, for every admitted request, the turns it continues, and sorts each missed token
(a full prompt block that was neither on the GPU nor in the CPU tier) by the request
(one that continues an earlier turn, or another) and by cause:

* ``evicted_under_way``: the block held an earlier turn of the same conversation (the
  request's prompt contains an earlier request's whole prompt, or prompt and answer),
  was cached, and was evicted before this turn came: a conversation still under way
  lost its KV to other requests;
* ``evicted``: cached once and evicted, but no earlier turn of this conversation
  (a prefix shared across conversations, such as a system prompt);
* ``new``: never cached (a first turn, the new message of a later turn).

A conversation is recognised by the hash chain alone, as the prefix cache itself keys
blocks: each full block's hash chains every token before it, so an earlier request's
last block hash in this request's chain means this request continues it.

The share the report shows is, of the tokens that continuing requests missed, those
``evicted_under_way``: 0 where every later turn found its history (only its new message
missed), near 1 where long conversations lose their history to other traffic.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import StrEnum

# Bounds on what is remembered (hashes, a few bytes each): far more than any level sees.
MAX_REMEMBERED = 1 << 20


class MissCause(StrEnum):
    """Why a missed prompt block was not in the prefix cache."""

    EVICTED_UNDER_WAY = "evicted_under_way"
    EVICTED = "evicted"
    NEW = "new"


class MissedBy(StrEnum):
    """Which requests missed: later turns of a conversation, or the rest."""

    CONTINUING = "continuing"
    OTHER = "other"


class LostHistory:
    """Evicted block hashes, the turns requests ended on, and missed tokens by cause."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._evicted: OrderedDict[int, None] = OrderedDict()
        self._turn_tails: OrderedDict[int, None] = OrderedDict()
        self.miss_tokens: dict[tuple[MissedBy, MissCause], int] = {
            (by, cause): 0 for by in MissedBy for cause in MissCause
        }
        self.continuing_requests = 0  # admitted requests that continue an earlier turn
        self.history_evicted_requests = 0  # of those, the ones whose earlier turns were evicted

    # -- the pool's events ----------------------------------------------------------------

    def evicted(self, block_hash: int) -> None:
        evicted = self._evicted
        evicted[block_hash] = None
        if len(evicted) > MAX_REMEMBERED:
            evicted.popitem(last=False)

    def cached(self, block_hash: int) -> None:
        self._evicted.pop(block_hash, None)

    # -- the engine's ---------------------------------------------------------------------

    def turn_ended(self, block_hashes: list[int], num_blocks: int) -> None:
        """A request's first ``num_blocks`` full blocks form a turn a later one may continue."""
        if num_blocks <= 0 or num_blocks > len(block_hashes):
            return
        tails = self._turn_tails
        tails[block_hashes[num_blocks - 1]] = None
        tails.move_to_end(block_hashes[num_blocks - 1])
        if len(tails) > MAX_REMEMBERED:
            tails.popitem(last=False)

    def admitted(self, block_hashes: list[int], usable: int, hit_blocks: int) -> None:
        """Sort the missed blocks ``hit_blocks .. usable - 1`` of an admitted request by cause."""
        tails = self._turn_tails
        continued = -1  # the deepest block that ended an earlier turn
        for depth in range(min(usable, len(block_hashes)) - 1, -1, -1):
            if block_hashes[depth] in tails:
                continued = depth
                break
        by = MissedBy.CONTINUING if continued >= 0 else MissedBy.OTHER
        if continued >= 0:
            self.continuing_requests += 1
        evicted = self._evicted
        size = self.block_size
        misses = self.miss_tokens
        lost_turn = continued >= hit_blocks and block_hashes[hit_blocks] in evicted
        if lost_turn:
            self.history_evicted_requests += 1
            misses[by, MissCause.EVICTED_UNDER_WAY] += (continued + 1 - hit_blocks) * size
        for depth in range(continued + 1 if lost_turn else hit_blocks, usable):
            cause = MissCause.EVICTED if block_hashes[depth] in evicted else MissCause.NEW
            misses[by, cause] += size

    @property
    def evicted_under_way_share(self) -> float | None:
        return evicted_under_way_share(self.miss_tokens)

    def counts(self) -> tuple[int, int, int, int]:
        """(continuing requests, of those with their history evicted, tokens they missed,
        of those their own history evicted while under way)."""
        misses = self.miss_tokens
        return (
            self.continuing_requests,
            self.history_evicted_requests,
            sum(n for (by, _), n in misses.items() if by is MissedBy.CONTINUING),
            misses[MissedBy.CONTINUING, MissCause.EVICTED_UNDER_WAY],
        )


def evicted_under_way_share(miss_tokens: dict[tuple[MissedBy, MissCause], int]) -> float | None:
    """Of the tokens later turns missed, the share that was their own conversation's
    history evicted while it was under way (None: no later turn missed anything)."""
    total = sum(n for (by, _), n in miss_tokens.items() if by is MissedBy.CONTINUING)
    lost = miss_tokens.get((MissedBy.CONTINUING, MissCause.EVICTED_UNDER_WAY), 0)
    return lost / total if total else None
