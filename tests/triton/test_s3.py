"""Model repositories in S3, against a real S3 server (moto's, on loopback: tests/triton/s3_fixture.py).

What holds: every command recognises an ``s3://`` repository and refuses other URLs without creating
a folder; a publish uploads each version whole and names it in ``config.pbtxt`` last; a publish killed
mid-upload leaves the previous version served, and the next publish removes its partial upload; the
embedded tritonserver serves the bucket itself (the URL on its command line, the credentials only in
its environment and in no log), and a version published while it runs is loaded on request.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pipeline.core.errors import PipelineError
from pipeline.core.objectstore import S3Url, repository_from_text
from pipeline.core.onnx_files import data_name, save_onnx
from pipeline.data.artifacts import Artifact
from pipeline.triton.config import parse_config
from pipeline.triton.s3repository import local_copy, publish_s3_repository
from pipeline.triton.server import TritonServer
from tests.conftest import ROOT, Built, cli, one_line_error
from tests.triton.conftest import SOFTMAX_WEIGHTS, softmax_config, softmax_onnx
from tests.triton.s3_fixture import S3Endpoint, monkeypatch_module, s3  # noqa: F401  (fixtures)

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LABELS = {"labels.txt": b"a\nb\nc\n"}


def softmax_file(path: Path, scale: float, external: bool = False) -> Path:
    """The tests' softmax model with its weights times ``scale`` (another artifact, other answers); with ``external``,
    its weights in ``<path>.data`` beside it, as a model over 2 GB keeps them."""
    model = onnx.load(str(softmax_onnx(path)))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(SOFTMAX_WEIGHTS * scale, "w"))
    if external:  # even its 48 bytes (ONNX leaves tensors under 1 KB inline by default)
        (path.parent / data_name(path)).unlink(missing_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, location=data_name(path), size_threshold=0)
    else:
        save_onnx(model, path, external=False)
    return path


def killed_at_pause(script: str, point: str, marker: Path, **env: str) -> None:
    """Run ``script`` in a Python process held at pause point ``point`` (pipeline/core/pausepoints.py), and SIGKILL it
    there. The process either pauses or ends (a failure, with its output); the 15-minute bound only keeps a hung one from
    holding the suite."""
    environ = dict(os.environ, PYTHONPATH=str(ROOT), PIPELINE_PAUSE_AT=point, PIPELINE_PAUSE_FILE=str(marker), **env)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    try:
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0].decode()[-2000:]
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def expected(x: np.ndarray, scale: float) -> np.ndarray:
    logits = x @ (SOFTMAX_WEIGHTS * scale)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def publish(url: S3Url, onnx_path: Path, policy: str = "new") -> list[str]:
    """Publish ``onnx_path`` as Triton model ``tiny_fp32`` (with a labels file: a second object after the model)."""
    cfg = softmax_config("tiny_fp32")
    return publish_s3_repository([Artifact("fp32", "onnx", onnx_path)], model="tiny", url=url, configs={"tiny_fp32": cfg},
                                 extra_files={"tiny_fp32": LABELS}, version_policy=policy)


def infer(server: TritonServer, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with closing(httpclient.InferenceServerClient(server.http_url)) as client:
        return np.asarray(client.infer(model, [inp]).as_numpy("probs"))


def served_versions(server: TritonServer, model: str) -> list[str]:
    with _DIRECT.open(f"http://{server.http_url}/v2/models/{model}", timeout=10) as response:
        return list(json.loads(response.read())["versions"])


# ---- which repositories are accepted -------------------------------------------------------------------


def test_s3_urls_are_parsed_and_other_urls_refused() -> None:
    assert repository_from_text("s3://models/repo/") == S3Url("models", "repo")
    assert repository_from_text("s3://models") == S3Url("models", "")
    assert repository_from_text("s3://http://127.0.0.1:9000/models/a/b") == S3Url("models", "a/b", "http://127.0.0.1:9000")
    assert str(S3Url("models", "a/b", "http://127.0.0.1:9000")) == "s3://http://127.0.0.1:9000/models/a/b"
    assert S3Url("models", "repo").triton_url("http://127.0.0.1:9000/") == "s3://http://127.0.0.1:9000/models/repo"
    assert repository_from_text("model_repository") == Path("model_repository")
    assert repository_from_text("./s3:/x") == Path("s3:/x")  # an explicit folder stays a folder
    for text, words in (("gs://b/p", "Google Cloud Storage"), ("as://acct/c", "Azure Storage"), ("https://h/p", "https://"),
                        ("s3:/models/repo", "two slashes"), ("s3://Not_A_Bucket/p", "no valid bucket")):
        with pytest.raises(PipelineError, match=words) as info:
            repository_from_text(text)
        assert "s3://BUCKET/PREFIX" in str(info.value)


@pytest.mark.parametrize("command", [
    ["build"], ["serve"], ["verify"], ["deploy"], ["loadtest"], ["tune", "--model", "m"], ["mig-plan", "--gpu", "H200-141GB"],
])
def test_no_command_takes_a_url_for_a_folder(command: list[str], tmp_path: Path) -> None:
    for url, words in (("gs://models/repo", "Google Cloud Storage is not supported"), ("s3:/models/repo", "neither a folder nor an s3:// URL")):
        line = one_line_error(cli(*command, "--repository", url, cwd=tmp_path))
        assert words in line and "s3://BUCKET/PREFIX" in line
    assert list(tmp_path.iterdir()) == []  # no folder named gs: or s3:
    if command[0] == "tune":  # it reads and (--apply) writes a folder: an s3:// repository is refused too
        assert "local model repository" in one_line_error(cli(*command, "--repository", "s3://models/repo", cwd=tmp_path))


def test_a_config_file_url_is_checked_too(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[build]\nrepository = "gs://models/repo"\n')
    line = one_line_error(cli("build", "--config", "p.toml", cwd=tmp_path))
    assert "'repository' in p.toml [build]: gs://models/repo: Google Cloud Storage is not supported" in line


def test_a_missing_bucket_is_refused_before_the_build(s3: S3Endpoint, tmp_path: Path) -> None:
    line = one_line_error(cli("build", "--repository", "s3://no-such-bucket/repo", cwd=tmp_path, env=dict(s3.env)))
    assert "s3://no-such-bucket/repo does not exist" in line and "aws s3 mb" in line
    assert not (tmp_path / "build").exists()


# ---- publishing --------------------------------------------------------------------------------------


def test_each_publish_uploads_a_whole_version_and_pins_it_in_the_config(s3: S3Endpoint, tmp_path: Path) -> None:
    bucket = s3.bucket()
    url = S3Url(bucket, "repo")
    first = softmax_file(tmp_path / "a.onnx", 1.0)
    assert publish(url, first) == [f"s3://{bucket}/repo/tiny_fp32/1"]
    config = parse_config(s3.text(bucket, "repo/tiny_fp32/config.pbtxt"))
    assert list(config.version_policy.specific.versions) == [1]
    assert s3.keys(bucket) == [f"repo/tiny_fp32/{k}" for k in (".pipeline-owned.json", ".pipeline-report.json", "1/model.onnx", "config.pbtxt", "labels.txt")]
    assert "uploading" not in json.loads(s3.text(bucket, "repo/tiny_fp32/.pipeline-owned.json"))

    assert publish(url, first) == [f"s3://{bucket}/repo/tiny_fp32/1"]  # nothing changed: no new version
    second = softmax_file(tmp_path / "b.onnx", 2.0)
    assert publish(url, second) == [f"s3://{bucket}/repo/tiny_fp32/2"]
    assert list(parse_config(s3.text(bucket, "repo/tiny_fp32/config.pbtxt")).version_policy.specific.versions) == [2]
    assert f"repo/tiny_fp32/1/model.onnx" in s3.keys(bucket)  # policy new keeps the older version
    report = json.loads(s3.text(bucket, "repo/tiny_fp32/.pipeline-report.json"))
    assert sorted(report["versions"]) == ["1", "2"]

    s3.client().put_object(Bucket=bucket, Key="repo/tiny_fp32/2/notes.txt", Body=b"mine")  # a file the pipeline did not write
    with pytest.raises(PipelineError, match="files the pipeline did not write"):
        publish(url, first, policy="replace")
    s3.client().delete_object(Bucket=bucket, Key="repo/tiny_fp32/2/notes.txt")
    assert publish(url, first, policy="replace") == [f"s3://{bucket}/repo/tiny_fp32/3"]
    assert [k for k in s3.keys(bucket) if k.split("/")[2].isdigit()] == ["repo/tiny_fp32/3/model.onnx"]  # the older ones went after


def test_a_version_whose_config_was_written_is_kept_when_its_record_was_not(s3: S3Endpoint, tmp_path: Path) -> None:
    """A publish killed between writing config.pbtxt and finishing its record: the named version is whole, so it stays."""
    bucket = s3.bucket()
    url = S3Url(bucket, "repo")
    publish(url, softmax_file(tmp_path / "a.onnx", 1.0))
    second = softmax_file(tmp_path / "b.onnx", 2.0)
    publish(url, second)
    owned = json.loads(s3.text(bucket, "repo/tiny_fp32/.pipeline-owned.json"))
    unfinished = {"versions": [1], "files": [f for f in owned["files"] if not f.startswith("2/")], "uploading": 2}
    s3.client().put_object(Bucket=bucket, Key="repo/tiny_fp32/.pipeline-owned.json", Body=json.dumps(unfinished).encode())
    assert publish(url, second) == [f"s3://{bucket}/repo/tiny_fp32/2"]  # unchanged: version 2 kept, not deleted
    assert "repo/tiny_fp32/2/model.onnx" in s3.keys(bucket)


@pytest.mark.slow
@pytest.mark.parametrize("external", [False, True], ids=["one file", "with its data file"])
def test_a_killed_publish_leaves_the_previous_version_served_and_the_next_one_cleans_up(external: bool, s3: S3Endpoint, tmp_path: Path) -> None:
    """With a data file (a model over 2 GB), the kill falls between the graph's upload and its data file's."""
    bucket = s3.bucket()
    url = S3Url(bucket, "repo")
    publish(url, softmax_file(tmp_path / "a.onnx", 1.0, external))
    if external:
        assert {"repo/tiny_fp32/1/model.onnx", "repo/tiny_fp32/1/model.onnx.data"} <= set(s3.keys(bucket))
    second = softmax_file(tmp_path / "b.onnx", 2.0, external)
    marker = tmp_path / "paused"
    script = ("import sys; from pathlib import Path; from tests.triton.test_s3 import publish; from pipeline.core.objectstore import S3Url; "
              f"publish(S3Url({bucket!r}, 'repo'), Path({str(second)!r}))")
    # Held after the first object of version 2 (its model file) is uploaded, before the labels and the config.
    killed_at_pause(script, "publish.upload#2", marker)
    assert "repo/tiny_fp32/2/model.onnx" in s3.keys(bucket)  # the partial upload is there...
    assert "repo/tiny_fp32/2/model.onnx.data" not in s3.keys(bucket)  # (its graph without its weights, when it has a data file)
    assert list(parse_config(s3.text(bucket, "repo/tiny_fp32/config.pbtxt")).version_policy.specific.versions) == [1]  # ...unnamed

    x = np.array([[1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
    with TritonServer(url, workdir=tmp_path / "w") as server:
        assert server.ready_models == ["tiny_fp32"] and served_versions(server, "tiny_fp32") == ["1"]
        np.testing.assert_allclose(infer(server, "tiny_fp32", x), expected(x, 1.0), rtol=1e-5, atol=1e-6)
    copied = local_copy(url, tmp_path / "copy") / "tiny_fp32"  # what verify and loadtest read: the served version only
    assert sorted(p.name for p in copied.iterdir() if p.is_dir()) == ["1"] and (copied / "1" / "model.onnx").is_file()
    assert (copied / "1" / "model.onnx.data").is_file() == external

    assert publish(url, second) == [f"s3://{bucket}/repo/tiny_fp32/2"]  # the partial version 2 is removed, then uploaded whole
    owned = json.loads(s3.text(bucket, "repo/tiny_fp32/.pipeline-owned.json"))
    assert owned["versions"] == [1, 2] and "uploading" not in owned


ITEM_ROWS, ITEM_COLS = 524_300, 1024  # 2,147,532,800 bytes of float32: just past protobuf's 2**31


def items_file(path: Path, data: str, scale: float) -> Path:
    """ids int64 [batch, 3] → ``scale`` × rows of a table over 2 GB whose row r is r everywhere → emb [batch, 3, 1024].
    The table lies in ``data`` (beside ``path``; written once, a block of rows at a time)."""
    table = path.parent / data
    if not table.exists():
        out = np.memmap(table, dtype=np.float32, mode="w+", shape=(ITEM_ROWS, ITEM_COLS))
        for start in range(0, ITEM_ROWS, 65536):
            stop = min(ITEM_ROWS, start + 65536)
            out[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
        out.flush()
        del out
    weights = onnx.TensorProto(name="table", data_type=onnx.TensorProto.FLOAT, dims=[ITEM_ROWS, ITEM_COLS],
                               data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", data), ("offset", "0"), ("length", str(ITEM_ROWS * ITEM_COLS * 4))):
        weights.external_data.add(key=key, value=value)
    nodes = [onnx.helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             onnx.helper.make_node("Mul", ["rows", "scale"], ["emb"])]
    graph = onnx.helper.make_graph(nodes, "items", [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch", 3])],
                                   [onnx.helper.make_tensor_value_info("emb", onnx.TensorProto.FLOAT, ["batch", 3, ITEM_COLS])],
                                   [weights, numpy_helper.from_array(np.array(scale, np.float32), "scale")])
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def publish_items(url: S3Url, onnx_path: Path) -> list[str]:
    """Publish ``onnx_path`` (see :func:`items_file`) as Triton model ``items_fp32``."""
    from tests.triton.conftest import model_config

    import tritonclient.grpc.model_config_pb2 as mc

    cfg = model_config("items_fp32", [("ids", mc.TYPE_INT64, [3])], [("emb", mc.TYPE_FP32, [3, ITEM_COLS])])
    return publish_s3_repository([Artifact("fp32", "onnx", onnx_path)], model="items", url=url, configs={"items_fp32": cfg})


@pytest.mark.slow
def test_a_publish_of_a_model_over_2gb_killed_in_its_data_file_leaves_the_previous_version_served(
        gigabytes_on_disk: None, s3: S3Endpoint, tmp_path: Path) -> None:
    """Version 1 (2.15 GB of weights in model.onnx.data) is served; version 2's publish is killed part way through
    uploading its data file (held after a thousand chunks, its other parts going on): the object was never
    completed, the config still names version 1, and the server loads version 1 and answers from its weights."""
    bucket = s3.bucket()
    url = S3Url(bucket, "repo")
    publish_items(url, items_file(tmp_path / "a.onnx", "items.data", 1.0))
    sizes = {item["Key"]: item["Size"] for item in s3.client().list_objects_v2(Bucket=bucket, Prefix="repo/items_fp32/1/")["Contents"]}
    assert sizes["repo/items_fp32/1/model.onnx.data"] > 2**31
    second = items_file(tmp_path / "b.onnx", "items.data", 2.0)  # the same weights, other answers: a new version
    marker = tmp_path / "paused"
    script = ("from pathlib import Path; from tests.triton.test_s3 import publish_items; from pipeline.core.objectstore import S3Url; "
              f"publish_items(S3Url({bucket!r}, 'repo'), Path({str(second)!r}))")
    (tmp_path / "tmp").mkdir()  # its staged copy, which a SIGKILL leaves behind, goes with this test's folder
    killed_at_pause(script, "publish.upload-bytes#1000", marker, TMPDIR=str(tmp_path / "tmp"))
    shutil.rmtree(tmp_path / "tmp")  # 2 GB less on the disk while the server copies version 1 out of the bucket
    keys = s3.keys(bucket)
    assert "repo/items_fp32/2/model.onnx" in keys and "repo/items_fp32/2/model.onnx.data" not in keys  # the upload was under way
    assert s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads")  # its parts, never completed into an object
    assert list(parse_config(s3.text(bucket, "repo/items_fp32/config.pbtxt")).version_policy.specific.versions) == [1]

    import tritonclient.http as httpclient

    ids = np.array([[0, 7, ITEM_ROWS - 1]], dtype=np.int64)
    try:
        with TritonServer(url, workdir=tmp_path / "w") as server:
            assert server.ready_models == ["items_fp32"] and served_versions(server, "items_fp32") == ["1"]
            inp = httpclient.InferInput("ids", list(ids.shape), "INT64")
            inp.set_data_from_numpy(ids)
            with closing(httpclient.InferenceServerClient(server.http_url)) as client:
                emb = np.asarray(client.infer("items_fp32", [inp]).as_numpy("emb"))
    finally:  # moto keeps objects and parts in files of this process until they are deleted: gigabytes
        client_s3 = s3.client()
        for upload in client_s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            client_s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        for key in s3.keys(bucket):
            client_s3.delete_object(Bucket=bucket, Key=key)
    np.testing.assert_array_equal(emb, np.broadcast_to(ids[..., None].astype(np.float32), (1, 3, ITEM_COLS)))  # version 1's: 1 × row


@pytest.mark.slow
def test_the_server_reads_the_bucket_and_loads_a_new_version_on_request(s3: S3Endpoint, tmp_path: Path) -> None:
    bucket = s3.bucket()
    url = S3Url(bucket, "live")
    publish(url, softmax_file(tmp_path / "a.onnx", 1.0))
    x = np.array([[0.5, 1.0, -1.0, 2.0]], dtype=np.float32)
    with TritonServer(url, workdir=tmp_path / "w", model_control="explicit") as server:
        assert served_versions(server, "tiny_fp32") == ["1"]
        np.testing.assert_allclose(infer(server, "tiny_fp32", x), expected(x, 1.0), rtol=1e-5, atol=1e-6)
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
        assert f"--model-repository=s3://{s3.endpoint}/{bucket}/live" in command  # the bucket itself, no view
        assert not any(s3.secret in arg or s3.key_id in arg for arg in command)
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().decode()
        assert f"AWS_SECRET_ACCESS_KEY={s3.secret}" in environ  # how it gets them

        publish(url, softmax_file(tmp_path / "b.onnx", 2.0))  # while it serves version 1
        np.testing.assert_allclose(infer(server, "tiny_fp32", x), expected(x, 1.0), rtol=1e-5, atol=1e-6)
        request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/tiny_fp32/load", data=b"{}", method="POST")
        with _DIRECT.open(request, timeout=60) as response:
            assert response.status == 200
        assert served_versions(server, "tiny_fp32") == ["2"]
        np.testing.assert_allclose(infer(server, "tiny_fp32", x), expected(x, 2.0), rtol=1e-5, atol=1e-6)
        log = Path(server.log_path).read_text()  # type: ignore[arg-type]
    assert bucket in log and s3.secret not in log and s3.key_id not in log


def test_a_cpu_machine_refuses_gpu_configs_it_cannot_rewrite_in_a_bucket(s3: S3Endpoint, tmp_path: Path) -> None:
    from pipeline.triton.servable import has_gpu
    from tritonclient.grpc import model_config_pb2 as mc

    bucket = s3.bucket()
    url = S3Url(bucket, "gpu")
    cfg = softmax_config("tiny_fp32")
    cfg.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    publish_s3_repository([Artifact("fp32", "onnx", softmax_file(tmp_path / "a.onnx", 1.0))], model="tiny", url=url, configs={"tiny_fp32": cfg})
    if has_gpu():
        pytest.skip("this machine has a GPU: KIND_GPU loads here")
    with pytest.raises(PipelineError, match="ask for KIND_GPU instances and this machine has no GPU"):
        TritonServer(url, workdir=tmp_path / "w").start()


def _gpu_model_in_bucket(s3: S3Endpoint, tmp_path: Path) -> S3Url:
    from tritonclient.grpc import model_config_pb2 as mc

    url = S3Url(s3.bucket(), "repo")
    cfg = softmax_config("tiny_fp32")
    cfg.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    publish_s3_repository([Artifact("fp32", "onnx", softmax_file(tmp_path / "a.onnx", 1.0))], model="tiny", url=url, configs={"tiny_fp32": cfg})
    return url


def _no_credentials_in(folder: Path, s3: S3Endpoint) -> list[Path]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    for path in files:
        text = path.read_text()
        assert s3.secret not in text and s3.key_id not in text, path
    return files


def test_the_deploy_bundle_reads_the_bucket_with_credentials_from_the_environment(s3: S3Endpoint, tmp_path: Path) -> None:
    import yaml

    from pipeline.triton.deploy import write_deploy_bundle

    url = _gpu_model_in_bucket(s3, tmp_path)
    write_deploy_bundle(url, tmp_path / "deploy")
    assert len(_no_credentials_in(tmp_path / "deploy", s3)) >= 3
    service = yaml.safe_load((tmp_path / "deploy" / "compose.yaml").read_text())["services"]["triton"]
    assert "volumes" not in service  # nothing mounted: the server reads the bucket
    assert f"--model-repository=s3://{s3.endpoint}/{url.bucket}/repo" in service["command"][2]
    assert service["environment"]["AWS_SECRET_ACCESS_KEY"].startswith("${AWS_SECRET_ACCESS_KEY:?")
    assert service["environment"]["AWS_DEFAULT_REGION"] == "${AWS_DEFAULT_REGION:-eu-west-1}"
    script = (tmp_path / "deploy" / "docker-run.sh").read_text()
    assert "-e AWS_ACCESS_KEY_ID" in script and "-e AWS_SECRET_ACCESS_KEY" in script and "MODEL_REPOSITORY" not in script


def test_kubernetes_and_kserve_manifests_read_the_bucket_with_credentials_from_a_secret(s3: S3Endpoint, tmp_path: Path) -> None:
    import yaml

    url = _gpu_model_in_bucket(s3, tmp_path)
    proc = cli("mig-plan", "--gpu", "H200-141GB", "--layout", "3x2g.35gb,1x1g.18gb+me", "--repository", str(url), "--bundle", "bundle",
               cwd=tmp_path, env=dict(s3.env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "per-profile configs are not written" in proc.stderr
    manifests = [p for p in _no_credentials_in(tmp_path / "bundle", s3) if p.suffix == ".yaml" and "k8s" in p.parts]
    docs = {p.relative_to(tmp_path / "bundle").as_posix(): [d for d in yaml.safe_load_all(p.read_text()) if d] for p in manifests}
    deployment = next(d for d in docs["k8s/triton-mig-2g-35gb.yaml"] if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    [container] = deployment["containers"]
    assert f"--model-repository=s3://{s3.endpoint}/{url.bucket}/repo" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"] == {"secretKeyRef": {"name": "triton-s3", "key": key}}
    assert env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    assert all(v["name"] != "model-repository" for v in deployment["volumes"])
    [isvc] = docs["k8s/kserve/triton-mig-2g-35gb.yaml"]
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"s3://{url.bucket}/repo"
    assert isvc["spec"]["predictor"]["serviceAccountName"] == "triton-s3"
    assert docs["k8s/kserve/s3-service-account.yaml"] == [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "triton-s3"},
                                                          "secrets": [{"name": "triton-s3"}]}]
    validate = Path(sys.executable).parent / "kubernetes-validate"
    run = subprocess.run([str(validate), "--strict", "-k", "1.37.0", *map(str, manifests)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
def test_the_bundled_model_builds_into_a_bucket_and_serves_from_it_as_from_a_folder(s3: S3Endpoint, built: Built, tmp_path: Path) -> None:
    """CI acceptance: build --repository s3://… → verify --repository s3://… (the embedded server on the bucket)
    passes, with the same answers as the local repository of the same build."""
    import shutil

    workdir = tmp_path / "build"
    shutil.copytree(built.workdir, workdir)  # the shared build's stages are reused: only publishing runs
    url = f"s3://{s3.bucket()}/models"
    build = cli("build", "--fp16", "--int8", "--workdir", str(workdir), "--repository", url, cwd=tmp_path, env=dict(s3.env))
    assert build.returncode == 0, build.stderr[-3000:]
    bucket = url.split("/")[2]
    assert {k.split("/")[1] for k in s3.keys(bucket)} == {p.name for p in built.repository.iterdir() if p.is_dir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("s3")]  # no folder named after the URL
    remote = cli("verify", "--repository", url, "--workdir", str(tmp_path / "remote"), cwd=tmp_path, env=dict(s3.env))
    assert remote.returncode == 0, remote.stderr[-3000:]
    local = cli("verify", "--repository", str(built.repository), "--workdir", str(tmp_path / "local"), cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    rows = [json.loads((tmp_path / where / "verify.json").read_text())["models"] for where in ("remote", "local")]
    assert rows[0] == rows[1] and len(rows[0]) >= 3
    for output in (build.stdout + build.stderr, remote.stdout + remote.stderr):
        assert s3.secret not in output and s3.key_id not in output
    for log in (tmp_path / "remote" / "triton").glob("*.log"):
        assert bucket in log.read_text() and s3.secret not in log.read_text()


@pytest.mark.slow
def test_loadtest_starts_the_embedded_server_on_the_bucket(s3: S3Endpoint, tmp_path: Path) -> None:
    import argparse

    from pipeline.commands.loadtest import register

    url = S3Url(s3.bucket(), "load")
    publish(url, softmax_file(tmp_path / "a.onnx", 1.0))
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["loadtest", "--repository", str(url), "--data", str(tmp_path / "x.npz"), "--concurrency", "1",
                              "--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "2", "--timeout-ms", "2000",
                              "--stability-percentage", "99.9", "--workdir", str(tmp_path / "w"), "--report-dir", str(tmp_path / "report")])
    assert args.handler(args) == 0  # 1 would mean failed requests (or a point unstable beyond 99.9 %)
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [p["model"] for p in report["points"]] == ["tiny_fp32"]
