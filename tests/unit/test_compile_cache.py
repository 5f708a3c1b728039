"""What each new compile key costs a tune: the trial line's note, and the sim's cache key."""

from __future__ import annotations

from pathlib import Path

from tuner.search.compile_cache import CompileLaunches
from tuner.sim.compile_cache import CompileCache, cache_root
from tuner.vllm.memory import ServingParams
from tuner.vllm.space import TrialParams
from tuner.vllm.versions import VllmVersion


def _launch(
    launches: CompileLaunches, params: TrialParams, launch_s: float | None, new: str = ""
) -> str | None:
    before = launches.entries()
    if new:  # the server compiled: vLLM's cache gained an entry
        assert launches.cache_root is not None
        (launches.cache_root / "torch_compile_cache" / new).mkdir(parents=True)
    return launches.launched(params, launch_s, before=before)


def test_each_new_block_size_and_kv_dtype_says_what_its_launch_cost(tmp_path: Path) -> None:
    launches = CompileLaunches(tmp_path / "vllm-cache")
    b16 = TrialParams(block_size=16, gpu_memory_utilization=0.9)
    first = _launch(launches, b16, 95.0, new="aaaa")
    assert first == (
        "first launch of block size 16, KV auto in this run: compiled (a new entry in "
        "vLLM's compile cache); launch 95 s (no warm launch yet to compare)"
    )
    # Another memory setting, the same compile key: warm, no note.
    assert _launch(launches, b16.model_copy(update={"gpu_memory_utilization": 0.8}), 40.0) is None
    assert _launch(launches, b16.model_copy(update={"max_num_seqs": 64}), 44.0) is None
    fp8 = TrialParams(block_size=16, kv_cache_dtype="fp8")
    assert _launch(launches, fp8, 90.0, new="bbbb") == (
        "first launch of block size 16, KV fp8 in this run: compiled (a new entry in vLLM's "
        "compile cache); launch 90 s vs 42 s warm (median of 2; +48 s)"
    )
    # A pair an earlier run compiled into the shared cache: found there, no new entry.
    note = _launch(launches, TrialParams(block_size=32), 41.0)
    assert note is not None and "found compiled in vLLM's compile cache" in note
    # A screened trial never launched: nothing to say, and its pair is still new after.
    assert _launch(launches, TrialParams(block_size=64), None) is None
    assert _launch(launches, TrialParams(block_size=64), 80.0, new="cccc") is not None


def test_the_sims_compile_key_is_the_knobs_in_vllms_hash(tmp_path: Path) -> None:
    env = {"VLLM_CACHE_ROOT": str(tmp_path)}
    v = VllmVersion.current()
    base = ServingParams(block_size=16)

    def entry(params: ServingParams, version: VllmVersion = v) -> Path:
        return CompileCache.of("llama-3.1-8b", params, version, env).directory

    assert entry(base).parent == tmp_path / "torch_compile_cache"
    same = base.model_copy(update={"gpu_memory_utilization": 0.5, "max_num_seqs": 8})
    assert entry(same) == entry(base)
    for changed in ({"block_size": 32}, {"kv_cache_dtype": "fp8"}, {"tensor_parallel_size": 2}):
        assert entry(base.model_copy(update=changed)) != entry(base), changed
    # Before PR #26468 only the cache dtype of CacheConfig was hashed, not the block size.
    old = VllmVersion.parse("0.10")
    assert entry(base.model_copy(update={"block_size": 32}), old) == entry(base, old)
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/vllm")
    assert cache_root({"HOME": "/h"}).name == "vllm"
