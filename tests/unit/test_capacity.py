"""The capacity plan (issue 19): the fleet's arithmetic, the bad input, the configs of the
chosen option, and a plan screened on the twin."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.tuner_command import tuner_in_process, tuner_process
from tests.unit.test_configs import assert_valid_k8s, by_kind, docs_of
from tuner.capacity.calibration import PAPER_ERROR, Provenance
from tuner.capacity.fleet import fleet_size, pareto_front, parse_prices, replicas_for
from tuner.capacity.option import OptionSpace, OptionStatus
from tuner.capacity.plan import make_plan, write_plan
from tuner.errors import ConfigError
from tuner.search.context import workload_context
from tuner.vllm.gpus import get_gpu
from tuner.vllm.models import resolve_model
from tuner.vllm.versions import VllmVersion
from workloads.spec import load_workload

# One worker: the module's small plan (about 10 s of the twin's screening) is built once,
# not once on each worker a test of it lands on.
pytestmark = pytest.mark.xdist_group("capacity-plan")

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "workloads" / "tiny.yaml"


def test_replicas_hold_the_peak_with_the_headroom() -> None:
    # 100 / (10 x 0.8) = 12.5: 13 replicas; exactly 10 x 0.8 = 8 per replica: 100/8 -> 13
    assert replicas_for(100.0, 10.0, 0.2) == 13
    assert replicas_for(80.0, 10.0, 0.2) == 10  # 80 / 8 = 10 exactly, not 11
    assert replicas_for(0.5, 10.0, 0.2) == 1
    assert replicas_for(24.0, 3.0, 0.0) == 8
    with pytest.raises(ValueError):
        replicas_for(0.0, 10.0, 0.2)


def test_fleet_cost_per_hour_and_per_million_output_tokens() -> None:
    fleet = fleet_size(
        peak=20.0, goodput_per_replica=5.0, headroom=0.2, tensor_parallel_size=2,
        usd_per_gpu_hour=2.5, output_tokens_per_unit=300.0,
    )  # fmt: skip
    assert fleet.replicas == 5 and fleet.gpus == 10  # 20 / 4 = 5 replicas of 2 GPUs
    assert fleet.usd_per_hour == pytest.approx(25.0)
    # 20/s x 300 tokens x 3600 s = 21.6 M tokens an hour for $25
    assert fleet.usd_per_million_output_tokens == pytest.approx(25.0 / 21.6)
    unpriced = fleet_size(
        peak=20.0, goodput_per_replica=5.0, headroom=0.2, tensor_parallel_size=2,
        usd_per_gpu_hour=None, output_tokens_per_unit=300.0,
    )  # fmt: skip
    assert unpriced.usd_per_hour is None and unpriced.usd_per_million_output_tokens is None


def test_prices_name_a_gpu_of_the_plan_and_cover_all_or_none() -> None:
    canonical = {"h100-80gb": "H100-80GB", "h100": "H100-80GB", "l4-24gb": "L4-24GB", "l4": "L4-24GB"}  # fmt: skip
    assert parse_prices(["H100=2.5", "l4=0.7"], canonical) == {"H100-80GB": 2.5, "L4-24GB": 0.7}
    assert parse_prices([], canonical) == {}
    for bad, says in (
        (["A100-80GB=1.2", "H100=1", "L4=1"], "not in the plan"),
        (["H100=cheap", "L4=1"], "GPU=USD_PER_HOUR"),
        (["H100=-1", "L4=1"], "GPU=USD_PER_HOUR"),
        (["H100=2.5"], "no --price for L4-24GB"),
    ):
        with pytest.raises(ConfigError, match=says):
            parse_prices(bad, canonical)


def test_the_pareto_front_keeps_what_nothing_beats_on_both_axes() -> None:
    points = [(100.0, 10.0), (80.0, 20.0), (70.0, 15.0), (50.0, 30.0), (100.0, 5.0)]
    assert pareto_front(points) == [3, 1, 0]  # (70, 15) loses to (80, 20); (100, 5) to (100, 10)


BAD_INPUT = [
    (["--gpus", "H100-80GB,Z9000"], "unknown GPU 'Z9000'; known GPUs:"),
    (["--tensor-parallel-size", "1,3"], "--tensor-parallel-size 3 does not divide"),
    (["--tensor-parallel-size", "two"], "accepted: a comma list of integers"),
    (["--tensor-parallel-size", "8,16"], "16 is more GPUs than one node's 8"),
    (
        ["--gpus", "H100-80GB", "--price", "A100-80GB=1.5"],
        "not in the plan; accepted: H100-80GB",
    ),
    (["--peak", "0"], "--peak 0 is not accepted; accepted: a rate > 0"),
    (["--peak", "nan"], "--peak nan is not accepted"),
    (["--headroom", "1"], "--headroom 1 is not accepted"),
    (["--from", "nowhere"], "--from 'nowhere"),
]


def _bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], says: str, run: Callable[[list[str]], CompletedProcess[str]]
) -> None:
    base = ["capacity", "--model", "llama-3.1-8b", "--peak", "10", "--out", str(tmp_path / "plan")]
    done = run([*base, *args])
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp_path / "plan").exists()  # nothing screened, nothing written


def test_bad_input_in_a_process_of_its_own_is_one_line_and_exit_2(tmp_path: Path) -> None:
    args, says = BAD_INPUT[0]
    _bad_input_is_one_line_and_exit_2(
        tmp_path, args, says, lambda argv: tuner_process(argv, cwd=tmp_path)
    )


@pytest.mark.parametrize(("args", "says"), BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    _bad_input_is_one_line_and_exit_2(
        tmp_path, args, says, lambda argv: tuner_in_process(argv, capsys)
    )


def _tiny_space() -> OptionSpace:
    """The tiny workload's plan for llama-3.1-8b, its own defaults."""
    model = resolve_model("llama-3.1-8b")
    workload = load_workload(TINY)
    return OptionSpace(
        model=model, version=VllmVersion.current(), workload=workload, max_model_len=None,
        workload_context=workload_context(model, workload)[1], safety_margin=0.02,
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    space = _tiny_space()
    plan = make_plan(
        space=space, gpus=[get_gpu("L4"), get_gpu("A100-40GB")], tensor_parallel_sizes=[1, 2],
        peak=40.0, headroom=0.2, prices={"L4-24GB": 0.8, "A100-40GB": 1.6}, runs=[],
    )  # fmt: skip
    out = tmp_path_factory.mktemp("capacity")
    write_plan(plan, space.workload, out)
    return plan, out


def test_a_plan_ranks_the_options_by_the_cost_of_their_fleet(small_plan: tuple[object, Path]) -> None:  # fmt: skip
    plan, out = small_plan
    from tuner.capacity.plan import CapacityPlan

    assert isinstance(plan, CapacityPlan)
    serving = [o for o in plan.options if o.status is OptionStatus.SERVES]
    assert len(serving) >= 3
    costs = [o.fleet_low.usd_per_hour for o in serving if o.fleet_low]
    assert costs == sorted(costs) and plan.chosen == serving[0]
    for option in serving:
        assert option.provenance is Provenance.PAPER and option.error == PAPER_ERROR
        replica = option.replica
        assert replica is not None and option.fleet_low is not None and option.fleet is not None
        goodput = replica.goodput.arrival_rate_per_s
        assert option.goodput_low == pytest.approx(goodput * (1 - PAPER_ERROR))
        # the arithmetic, from the figures it states
        assert option.fleet_low.replicas == math.ceil(40.0 / (option.goodput_low * 0.8) - 1e-9)
        assert option.fleet_low.gpus == option.fleet_low.replicas * option.tensor_parallel_size
        price = {"L4-24GB": 0.8, "A100-40GB": 1.6}[option.gpu]
        assert option.fleet_low.usd_per_hour == pytest.approx(option.fleet_low.gpus * price)
        assert option.fleet.replicas <= option.fleet_low.replicas
    assert any(o.on_frontier for o in serving)
    saved = json.loads((out / "capacity.json").read_text())
    assert saved["chosen"]["gpu"] == plan.chosen.gpu  # type: ignore[union-attr]


def test_the_plan_names_the_gpus_whose_ranks_share_pcie(small_plan: tuple[object, Path]) -> None:
    plan, _ = small_plan
    from tuner.capacity.plan import CapacityPlan

    assert isinstance(plan, CapacityPlan)
    split = {o.gpu for o in plan.options if o.tensor_parallel_size == 2 and o.replica is not None}
    assert split == {"L4-24GB", "A100-40GB"}
    pcie = [n for n in plan.notes if "no NVLink" in n]
    assert len(pcie) == 1 and "L4-24GB" in pcie[0] and "A100-40GB" not in pcie[0], plan.notes


def test_a_workload_far_below_its_declared_rate_still_finds_its_goodput() -> None:
    """``code`` declares 4 req/s; llama-3.1-8b on an H100 holds about a tenth of it. The
    screen, stepping 25 % at a time, once gave up and said no rate met the SLO; an L4
    serves none of it (its longest prompts), and the plan still speaks in req/s."""
    model = resolve_model("llama-3.1-8b")
    workload = load_workload("code")
    space = OptionSpace(
        model=model, version=VllmVersion.current(), workload=workload, max_model_len=None,
        workload_context=workload_context(model, workload)[1], safety_margin=0.02,
    )  # fmt: skip
    plan = make_plan(
        space=space, gpus=[get_gpu("H100"), get_gpu("L4")], tensor_parallel_sizes=[1],
        peak=5.0, headroom=0.2, prices={}, runs=[],
    )  # fmt: skip
    by_gpu = {o.gpu: o for o in plan.options}
    h100 = by_gpu["H100-80GB"]
    assert h100.status is OptionStatus.SERVES and h100.replica is not None, h100.failure
    assert 0.1 < h100.replica.goodput.arrival_rate_per_s < 1.0  # a tenth of the declared 4
    assert by_gpu["L4-24GB"].status is not OptionStatus.SERVES
    assert plan.unit == "req/s"

    nothing = make_plan(
        space=space, gpus=[get_gpu("L4")], tensor_parallel_sizes=[1],
        peak=5.0, headroom=0.2, prices={}, runs=[],
    )  # fmt: skip
    assert nothing.chosen is None and nothing.unit == "req/s"


def test_the_chosen_and_runner_up_deploy_their_fleet(small_plan: tuple[object, Path]) -> None:
    plan, out = small_plan
    from tuner.capacity.plan import CapacityPlan

    assert isinstance(plan, CapacityPlan)
    for name, option in (("chosen", plan.chosen), ("runner-up", plan.runner_up)):
        assert option is not None and option.fleet_low is not None
        docs = docs_of((out / name / "kubernetes.yaml").read_text())
        assert_valid_k8s(docs)
        deployment = by_kind(docs, "Deployment")
        assert deployment["spec"]["replicas"] == option.fleet_low.replicas
        pod = deployment["spec"]["template"]["spec"]
        product = {"L4-24GB": "NVIDIA-L4", "A100-40GB": "NVIDIA-A100-SXM4-40GB"}[option.gpu]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}
        gpus = pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) == option.tensor_parallel_size
        args = (out / name / "vllm-args.txt").read_text()
        assert f"--gpu-memory-utilization {option.params.gpu_memory_utilization}" in args  # type: ignore[union-attr]
        if option.tensor_parallel_size > 1:
            assert f"--tensor-parallel-size {option.tensor_parallel_size}" in args


def test_the_report_shows_every_option_the_frontier_and_the_source(
    small_plan: tuple[object, Path],
) -> None:
    from reports.capacity import render_capacity_report
    from tuner.capacity.plan import CapacityPlan

    plan, _ = small_plan
    assert isinstance(plan, CapacityPlan) and plan.chosen is not None
    page = render_capacity_report(plan)
    assert page.count('<tr class="chosen">') == 1
    for option in plan.options:
        assert option.label in page
    front = [o for o in plan.options if o.on_frontier]
    assert page.count('fill="#2e7d32"') == len(front)  # the frontier's points, drawn green
    assert "predicted by the twin (paper, ±40%)" in page
    assert "<script" not in page  # offline, nothing to fetch


# --- the plan's speed: fewer twin runs, cheaper runs, the same answers ---------------------


def test_a_search_from_a_close_estimate_closes_in_two_runs() -> None:
    from tuner.serving.bracket import search

    calls: list[float] = []

    def held(rate: float) -> bool:
        calls.append(rate)
        return rate <= 10.5

    # first move of 1 + precision: held at 10, broke at 11, closed (11 / 10 = 1.1)
    assert search(held, 10.0, precision=0.1, max_runs=9, step=1.25, first_step=1.1) == 10.0
    assert calls == [10.0, 11.0]
    calls.clear()
    # later moves take the step: 10, 11, 13.75 (broke), then the bracket's middle
    assert search(lambda r: held(r) or r <= 12.0, 10.0, precision=0.1, max_runs=9, step=1.25,
                  first_step=1.1) >= 12.0 / 1.1  # fmt: skip
    assert calls[:3] == [10.0, 11.0, pytest.approx(13.75)]


def test_a_later_candidate_that_breaks_at_the_gain_to_beat_costs_one_run() -> None:
    from tuner.serving.bracket import search

    calls: list[float] = []
    to_beat = 10.0 * 1.05
    found = search(lambda r: calls.append(r) or r <= 10.2, to_beat, precision=0.1,
                   max_runs=9, step=1.25, first_step=1.1, floor_per_s=to_beat)  # fmt: skip
    assert found == 0.0 and calls == [to_beat]


def test_a_search_starts_under_the_estimate_scaled_from_screened_options() -> None:
    from tuner.capacity.start import UNDERSHOOT, ScreenedRate, paper_ratio, start_for

    a100, h100, h200 = get_gpu("A100-80GB"), get_gpu("H100-80GB"), get_gpu("H200-141GB")
    first = start_for([], a100, 1, default=1.0)
    assert first.rate_per_s == 1.0 and not first.estimated
    done = [ScreenedRate(a100, 1, 2.0)]
    # the same GPU type at another size, no other type screened at both: (k/k0) ** 0.8
    assert start_for(done, a100, 2, 1.0).rate_per_s == pytest.approx(2.0 * 2**0.8 / UNDERSHOOT)
    # another type: by the paper ratio from the nearest one screened at that size
    h100_1 = start_for(done, h100, 1, 1.0)
    assert h100_1.estimated
    assert h100_1.rate_per_s == pytest.approx(2.0 * paper_ratio(h100, a100) / UNDERSHOOT)
    # a size ratio as screened on the type nearest on paper (H100 for H200, not A100)
    done += [ScreenedRate(a100, 2, 5.0), ScreenedRate(h100, 1, 6.0), ScreenedRate(h100, 2, 9.0)]
    done += [ScreenedRate(h200, 1, 7.0)]
    assert start_for(done, h200, 2, 1.0).rate_per_s == pytest.approx(7.0 * 9.0 / 6.0 / UNDERSHOOT)


def test_runs_that_share_their_texts_are_the_same_runs() -> None:
    from tuner.twin.prediction import RunTexts, Setup, steady_run
    from tuner.vllm.memory import ServingParams
    from workloads.build import build_schedule
    from workloads.prompts import RememberingWordPromptBuilder

    chat = load_workload("chat")
    builder = RememberingWordPromptBuilder()
    for rate in (0.5, 0.8, 0.5):  # the second 0.5 from remembered texts
        level = chat.with_rate(rate).model_copy(update={"duration_s": 6.0})
        assert build_schedule(level, prompt_builder=builder) == build_schedule(level)
    setup = Setup(
        model=resolve_model("llama-3.1-8b"), gpu=get_gpu("H100-80GB"),
        version=VllmVersion.current(), params=ServingParams(gpu_memory_utilization=0.9),
    )  # fmt: skip
    texts = RunTexts()
    for rate in (1.0, 1.5):
        shared = steady_run(setup, chat, rate, warmup_s=2.0, window_s=4.0, texts=texts)
        alone = steady_run(setup, chat, rate, warmup_s=2.0, window_s=4.0)
        assert shared.result is not None and shared.result == alone.result
        assert shared.met == alone.met


def test_the_block_pool_hands_out_blocks_as_before_it_made_them_lazily() -> None:
    from tuner.sim.blocks import BlockPool

    # the stack of free blocks it stood for: [5, 4, 3, 2, 1], handed out from the top
    pool = BlockPool(6)
    assert pool.num_free == 5
    assert pool.allocate(2, 0.0) == [1, 2] and pool.allocate_one(0.0) == 3
    pool.free([1, 2], 1.0)  # the tail first: 2, then 1 on top
    assert pool.allocate(3, 2.0) == [1, 2, 4] and pool.num_free == 1
    assert pool.allocate(2, 3.0) is None and pool.allocate_one(3.0) == 5
    assert pool.num_free == 0 and pool.allocate_one(4.0) is None


def test_a_measured_option_is_told_where_the_twin_sees_more(
    small_plan: tuple[object, Path],
) -> None:
    """A measured option keeps the settings its tune measured (over that tune's space);
    where the twin's own settings for the GPU predict more beyond its range, a note says
    so, and none where the measurement is as good."""
    from tuner.capacity.calibration import twin_for
    from tuner.capacity.plan import CapacityPlan, _twin_pick_note

    plan, _ = small_plan
    assert isinstance(plan, CapacityPlan)
    option = next(o for o in plan.options if o.gpu == "L4-24GB" and o.tensor_parallel_size == 1)
    assert option.replica is not None and option.params is not None
    space = _tiny_space()
    gpu = get_gpu("L4")
    twin = twin_for(gpu, [])
    goodput = option.replica.goodput
    # measured at a third of what the twin's settings serve: told
    low = option.model_copy(
        update={
            "replica": option.replica.model_copy(
                update={"goodput": goodput.model_copy(
                    update={"arrival_rate_per_s": goodput.arrival_rate_per_s / 3}
                )}
            )
        }
    )  # fmt: skip
    note, runs = _twin_pick_note(space, gpu, 1, twin, low)
    assert runs > 0 and note is not None
    assert note.startswith("L4-24GB x1: the twin's own settings (--")
    assert f"against the {goodput.arrival_rate_per_s / 3:.2f} measured" in note
    # measured at what the twin predicts for its own settings: nothing to say
    same, _ = _twin_pick_note(space, gpu, 1, twin, option)
    assert same is None
