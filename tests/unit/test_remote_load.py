"""Load from several hosts, without processes: message payloads, addresses, bad input."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from tuner.cli.load_worker import locust_worker_command
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.search.config import load_config
from tuner.serving.load import FLAG_NAMES, LoadGenerators
from workloads.load_errors import LoadConfigError
from workloads.remote import RecordBatch, Share, reachable_url
from workloads.runner import (
    KEYWORD_NAMES,
    WorkerStats,
    _locust_command,
    _locust_env,
    parse_host_port,
    startup_lead_s,
    validate_generators,
)
from workloads.schedule import Api, RequestRecord, ScheduleCodec, ScheduledRequest


def over_the_wire(data: object) -> object:
    """What Locust's rpc does to a message's data (locust.rpc.protocol.Message)."""
    return msgpack.loads(msgpack.dumps(("type", data, "node")), raw=False, strict_map_key=False)[1]


def stats(index: int) -> WorkerStats:
    return WorkerStats(
        worker=f"w{index}", index=index, count=3, scheduled=2, sent=2, cap_hits=0,
        completed=1, failed=1, not_sent_stopped=0, max_in_flight=10, peak_in_flight=2,
        start_late_s=-0.5, wall_s=3.0, cpu_s=0.1, cpu_percent=3.3, send_lag_p50_ms=0.4,
        send_lag_p99_ms=1.2, send_lag_max_ms=1.3, stopped_early=False, kernel_timestamps=True,
        token_events=40, coalesced_events=1, read_delay_p50_ms=0.1, read_delay_p99_ms=None,
    )  # fmt: skip


def test_share_round_trips_through_locust_messages() -> None:
    requests = [
        ScheduledRequest(
            request_id="r1", send_s=0.25, api=Api.CHAT, prompt_tokens=12, max_tokens=8,
            messages=[{"role": "user", "content": "héllo\nworld"}], stream=False,
        ),
        ScheduledRequest(
            request_id="r4", send_s=1.5, api=Api.COMPLETIONS, prompt_tokens=3, max_tokens=2,
            prompt="a b c", warmup=True,
        ),
    ]  # fmt: skip
    writer, reader = ScheduleCodec(), ScheduleCodec()  # a share's lines, as the master sends them
    share = Share(
        index=1, count=3, host="http://127.0.0.1:8000", model="m", start_at_s=1.7e9 + 0.123456,
        request_timeout_s=600.0, max_in_flight=1366, api_key="k",
        requests=[writer.encode(r) for r in requests],
    )  # fmt: skip
    back = Share.from_data(over_the_wire(share.to_data()))
    assert back == share
    assert [reader.decode(line) for line in back.requests or []] == requests
    idle = Share.from_data(over_the_wire(share.model_copy(update={"requests": None}).to_data()))
    assert idle.requests is None


def test_record_batch_round_trips_with_and_without_stats() -> None:
    records = [
        RequestRecord(
            request_id="r1", scheduled_s=1.0, sent_s=1.001, prompt_tokens=12, output_tokens=3,
            status=200, first_token_s=1.05, end_s=1.2, token_times_s=[1.05, 1.1, 1.15],
            worker="w1",
        ),
        RequestRecord(
            request_id="r4", scheduled_s=2.0, sent_s=2.0, prompt_tokens=3, output_tokens=0,
            status=0, error="not sent: in-flight cap reached", worker="w1",
        ),
    ]  # fmt: skip
    batch = RecordBatch(index=1, lines=[r.to_json() for r in records])
    back = RecordBatch.from_data(over_the_wire(batch.to_data()))
    assert back.stats is None
    assert [RequestRecord.from_json(line) for line in back.lines] == records
    final = RecordBatch(index=1, lines=[], stats=stats(1))
    assert RecordBatch.from_data(over_the_wire(final.to_data())).stats == stats(1)


@pytest.mark.parametrize(
    ("url", "master", "expected"),
    [
        ("http://127.0.0.1:8000", "10.0.0.5", "http://10.0.0.5:8000"),
        ("http://0.0.0.0:8000/base", "10.0.0.5", "http://10.0.0.5:8000/base"),
        ("http://localhost:8000", "tuner-host", "http://tuner-host:8000"),
        ("http://127.0.0.1:8000", "fd00::5", "http://[fd00::5]:8000"),
        ("http://10.0.0.9:8000", "10.0.0.5", "http://10.0.0.9:8000"),  # already reachable
        ("https://vllm.example:443/v1", "10.0.0.5", "https://vllm.example:443/v1"),
    ],
)
def test_a_remote_worker_reaches_a_local_server_through_the_master_host(
    url: str, master: str, expected: str
) -> None:
    assert reachable_url(url, master) == expected


def test_host_port() -> None:
    assert parse_host_port("10.0.0.5:5557", "--master") == ("10.0.0.5", 5557)
    assert parse_host_port("[::1]:6000", "--master") == ("::1", 6000)
    for bad, why in (("10.0.0.5", "no host and port"), (":5557", "no host and port"),
                     ("h:x", "not a number"), ("h:0", "out of range"), ("h:65536", "out of range")):  # fmt: skip
        with pytest.raises(LoadConfigError, match=why):
            parse_host_port(bad, "--master")


def test_load_generators_reject_what_does_not_go_together() -> None:
    assert LoadGenerators().server_host == "127.0.0.1"
    remote = LoadGenerators(processes=2, remote_workers=3, master_bind="0.0.0.0:5557")
    assert remote.server_host == "0.0.0.0"
    assert remote.startup_lead_s == startup_lead_s(2, 3) > startup_lead_s(2, 0)
    assert LoadGenerators(remote_workers=1, master_bind="10.1.2.3:5557").server_host == "10.1.2.3"
    assert LoadGenerators(remote_workers=1, master_bind="127.0.0.1:5557").server_host == "127.0.0.1"
    assert LoadGenerators(processes=0, remote_workers=2, master_bind="h:1").startup_lead_s > 0
    cases = [
        ({"remote_workers": 2}, "--load-workers 2 needs --load-master-bind HOST:PORT"),
        ({"master_bind": "0.0.0.0:5557"}, "only used with remote workers"),
        ({"remote_workers": -1}, "--load-workers -1 is out of range"),
        ({"processes": 0}, "--processes 0 is out of range; accepted: an integer >= 1 "),
        ({"processes": -1, "remote_workers": 1, "master_bind": "h:1"}, "--processes -1 is out"),
        ({"remote_workers": 1, "master_bind": "0.0.0.0"}, "--load-master-bind '0.0.0.0' has no"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            LoadGenerators(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "as_keywords", "as_flags"),
    [
        ({"processes": 0}, "processes=0 is out of range", "--processes 0 is out of range"),
        ({"remote_workers": -1}, "remote_workers=-1 is out of range",
         "--load-workers -1 is out of range"),
        ({"remote_workers": 2}, "remote_workers=2 needs master_bind=HOST:PORT",
         "--load-workers 2 needs --load-master-bind HOST:PORT"),
        ({"master_bind": "h:1"}, "master_bind='h:1' is only used with remote workers",
         "--load-master-bind 'h:1' is only used with remote workers"),
        ({"remote_workers": 1, "master_bind": "h"}, "master_bind 'h' has no host and port",
         "--load-master-bind 'h' has no host and port"),
    ],
)  # fmt: skip
def test_one_validator_names_the_settings_as_its_caller_does(
    kwargs: dict[str, object], as_keywords: str, as_flags: str
) -> None:
    """run_load (keywords) and the tuner's commands (flags) share validate_generators."""
    settings: dict[str, object] = {"processes": 1, "remote_workers": 0, "master_bind": None}
    settings.update(kwargs)
    for names, expected in ((KEYWORD_NAMES, as_keywords), (FLAG_NAMES, as_flags)):
        with pytest.raises(LoadConfigError) as caught:
            validate_generators(**settings, names=names)  # type: ignore[arg-type]
        assert str(caught.value).startswith(expected), str(caught.value)
        assert "accepted" in str(caught.value)


def test_tune_config_checks_the_load_workers_before_anything_runs() -> None:
    config = load_config(None, {"load_workers": 2, "load_master_bind": "0.0.0.0:5557"})
    assert config.load_generators().remote_workers == 2
    with pytest.raises(ConfigError, match="needs --load-master-bind"):
        load_config(None, {"load_workers": 2})
    with pytest.raises(ConfigError, match="port 70000 is out of range"):
        load_config(None, {"load_workers": 1, "load_master_bind": "h:70000"})


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["load-worker", "--master", "10.0.0.5"],
         "tuner: error: --master '10.0.0.5' has no host and port; accepted: HOST:PORT"),
        (["load-worker", "--master", "10.0.0.5:99999"],
         "tuner: error: --master '10.0.0.5:99999': port 99999 is out of range; accepted"),
        (["load-worker", "--master", "10.0.0.5:5557", "--processes", "0"],
         "tuner: error: --processes 0 is out of range; accepted: an integer >= 1"),
        (["bench", "--url", "http://127.0.0.1:9", "--load-workers", "2"],
         "tuner: error: --load-workers 2 needs --load-master-bind HOST:PORT"),
        (["tune", "--load-workers", "1", "--load-master-bind", "nohost"],
         "tuner: error: --load-master-bind 'nohost' has no host and port"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_launches_nothing(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    extra = ["--out", str(out)] if argv[0] in ("load-worker", "bench") else ["--run-dir", str(out)]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert not out.exists()


def test_the_locust_environment_carries_no_tuner_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNER_STORAGE", "postgresql://tuner:pw-7f3a9@db/tune")
    monkeypatch.setenv("TUNER_SCHEDULE", "/elsewhere/schedule.jsonl")
    monkeypatch.setenv("LOCUST_USERS", "100")
    env = _locust_env(
        schedule_path=tmp_path / "schedule.jsonl", records_path=tmp_path / "records.jsonl",
        model="m", max_in_flight=64, processes=1, remote_workers=2, start_at_s=1.0,
        request_timeout_s=600.0,
    )  # fmt: skip
    assert "TUNER_STORAGE" not in env and "LOCUST_USERS" not in env
    assert env["TUNER_SCHEDULE"] == str(tmp_path / "schedule.jsonl")
    assert env["TUNER_WORKER_COUNT"] == "3" and "TUNER_WORKER_INDEX" not in env
    assert all("pw-7f3a9" not in value for value in env.values())


def test_master_and_agent_command_lines() -> None:
    cmd = _locust_command(
        "http://127.0.0.1:8000", processes=1, run_time_s=60, remote_workers=2,
        bind=("0.0.0.0", 5557), workers_wait_s=12.5,
    )  # fmt: skip
    joined = " ".join(cmd)
    assert "--users 3 --spawn-rate 3" in joined
    assert "--master-bind-host 0.0.0.0 --master-bind-port 5557 --expect-workers 3" in joined
    assert "--expect-workers-max-wait 13" in joined
    assert "--processes 1 --master-host 127.0.0.1 --master-port 5557" in joined
    only_master = _locust_command(
        "http://10.0.0.2:8000", processes=0, run_time_s=60, remote_workers=2,
        bind=("10.0.0.2", 6000),
    )  # fmt: skip
    assert "--master" in only_master and "--processes" not in only_master
    assert "--users 2" in " ".join(only_master)
    agent = locust_worker_command("10.0.0.5", 5557, 4)
    assert agent[-7:] == ["--worker", "--master-host", "10.0.0.5", "--master-port", "5557",
                          "--processes", "4"]  # fmt: skip
    assert "--processes" not in locust_worker_command("10.0.0.5", 5557, 1)
