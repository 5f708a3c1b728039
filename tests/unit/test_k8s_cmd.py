"""`tuner k8s-job`: the printed manifests validate and keep the storage password in the Secret."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes_validate import validate
from kubernetes_validate.utils import latest_version

from tuner.cli.main import main
from tuner.deploy import CACHE_MOUNT_PATH

PASSWORD = "Pa55-w0rd-k8s"
STORAGE = f"postgresql://optuna:{PASSWORD}@db.internal:5432/tuning"
BASE = ("k8s-job", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--workers", "3",
        "--study", "llama8b-h100")  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def docs_of(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for doc in docs:
        for version in ("1.29", latest_version()):
            validate(doc, version, strict=True)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_job_validates_and_the_password_is_only_in_the_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys, *BASE, "--storage", STORAGE, "--image", "ghcr.io/acme/tuner:1",
        "--", "--trials", "60", "--gpu", "H100-80GB",
    )  # fmt: skip
    assert code == 0, err
    docs = docs_of(out)
    assert [d["kind"] for d in docs] == ["Secret", "PersistentVolumeClaim", "Job"]
    secret, job = by_kind(docs, "Secret"), by_kind(docs, "Job")
    assert out.count(PASSWORD) == 1 and secret["stringData"]["url"] == STORAGE
    for doc in (job, by_kind(docs, "PersistentVolumeClaim")):
        text = yaml.safe_dump(doc)
        assert PASSWORD not in text and "db.internal" not in text
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 3
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/acme/tuner:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The storage reaches tuner tune as TUNER_STORAGE from the Secret, not on its command line.
    (env,) = [e for e in container["env"] if e["name"] == "TUNER_STORAGE"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "url"}
    args = container["args"]
    assert not any("STORAGE" in a or a.startswith("--storage") for a in args)
    assert args[:6] == ["tune", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                        "--study", "llama8b-h100", "--resume"]  # fmt: skip
    assert args[6:] == ["--trials", "60", "--gpu", "H100-80GB",
                        "--run-dir", f"{CACHE_MOUNT_PATH}/runs/llama8b-h100"]  # fmt: skip
    assert "Secret" in err and "--storage-secret" in err  # says what the output holds


def test_storage_from_the_environment_or_an_existing_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_STORAGE", STORAGE)
    code, out, _ = run(capsys, *BASE, "--", "--run-dir", "/data/run")
    assert code == 0
    docs = docs_of(out)
    assert by_kind(docs, "Secret")["stringData"]["url"] == STORAGE
    args = by_kind(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--run-dir", "/data/run"]  # a run directory given is kept

    monkeypatch.delenv("TUNER_STORAGE")
    code, out, err = run(
        capsys, *BASE, "--storage-secret", "optuna-db:dsn", "--cache-volume", "hostpath:/mnt/c"
    )
    assert code == 0, err
    docs = docs_of(out)
    assert [d["kind"] for d in docs] == ["Job"]  # nothing secret printed
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "optuna-db", "key": "dsn"}
    assert docs[0]["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/mnt/c"
    assert err == ""


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--storage", "sqlite:///runs/study.db"), "SQLite"),
        (("--storage", STORAGE, "--workers", "0"), "workers 0"),
        (("--storage", STORAGE, "--storage-secret", "db"), "--storage-secret"),
        (("--storage-secret", "Bad_Name"), "Bad_Name"),
        (("--storage", STORAGE, "--", "--study", "other"), "--study"),
        (("--storage", STORAGE, "--cache-volume", "nfs:/x"), "nfs:/x"),
        ((), "--storage"),
    ],
)
def test_bad_input_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: tuple[str, ...],
    needle: str,
) -> None:
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    code, out, err = run(capsys, *BASE, *extra)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error:") and needle in lines[0], err
    assert PASSWORD not in err


def test_an_unknown_tune_flag_fails_here_not_in_every_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*BASE, "--storage", STORAGE, "--", "--trails", "60"])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--trails" in err and PASSWORD not in err
