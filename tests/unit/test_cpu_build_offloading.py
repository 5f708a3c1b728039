"""On vLLM's CPU build the tune leaves the offloading knobs out with vLLM's own words
(the real build refuses them at startup: tests/vllm_cpu/test_kv_offloading.py)."""

from __future__ import annotations

from tuner.search.context import CPU_BUILD_REFUSAL, _cpu_space
from tuner.vllm.space import Knob


def test_the_cpu_build_leaves_the_offloading_knobs_out_in_vllms_words() -> None:
    knobs = (Knob.MAX_NUM_SEQS, Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY)
    space = _cpu_space(knobs, {}, accepted=None)
    searched = {r.knob for r in space.ranges}
    assert Knob.KV_OFFLOADING_SIZE not in searched and Knob.KV_OFFLOADING_POLICY not in searched
    reasons = {o.knob: o.reason for o in space.left_out}
    for knob in (Knob.KV_OFFLOADING_SIZE, Knob.KV_OFFLOADING_POLICY):
        assert CPU_BUILD_REFUSAL in reasons[knob], reasons
    assert Knob.MAX_NUM_SEQS in searched
