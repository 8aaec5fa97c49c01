"""A Triton model repository in S3: publishing into it safely, and a local copy of what Triton serves from it.

S3 has no rename, so a publish cannot swap a model directory in as the local publish does
(:mod:`pipeline.triton.repository`). Instead every model's ``config.pbtxt`` names the versions Triton
serves (``version_policy { specific { versions: [N] } }``), and a publish of model ``M``:

1. records in ``M/.pipeline-owned.json`` that it is uploading version ``N`` (the next free number);
2. uploads the whole version directory ``M/N/`` and the model's other files (labels, warmup samples);
3. writes ``M/config.pbtxt`` naming version ``N``: only now does Triton load ``N`` (on a restart, or a
   load request with explicit model control); until then it serves the previous version, untouched;
4. records ``N`` as complete in ``.pipeline-owned.json`` and its build in ``.pipeline-report.json``;
   with version policy ``replace``, only then are the versions the pipeline wrote before deleted.

A publish killed before step 3 leaves the previous version served (a half-uploaded ``M/N/`` is not
named by the config, so Triton ignores it); the next publish deletes that partial upload first. All
models are uploaded before any config is written. As locally, the pipeline deletes only versions
and files its own record lists. One publisher per repository at a time (S3 offers no lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.fingerprint import hash_path
from pipeline.core.objectstore import S3Url, s3_client
from pipeline.core.pausepoints import pause_point
from pipeline.data.artifacts import Artifact
from pipeline.triton.config import config_text, parse_config
from pipeline.triton.fsops import copy_artifact, write_synced
from pipeline.triton.repository import CONFIG, OWNED, REPORT, checked_request, check_staged, model_filename, version_report

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)


@dataclass
class _Remote:
    """One model directory in S3 as a publish finds it."""

    url: S3Url
    sizes: dict[str, int]  # relative key → size
    owned_versions: set[int] = field(default_factory=set)
    owned_files: set[str] = field(default_factory=set)
    uploading: int | None = None
    config: bytes | None = None

    @property
    def versions(self) -> set[int]:
        return {int(v) for v in (rel.split("/", 1)[0] for rel in self.sizes if "/" in rel) if v.isdigit() and not v.startswith("0")}

    def served(self) -> set[int]:
        """The versions its config names (all of them without a specific policy)."""
        if self.config is None:
            return set()
        policy = parse_config(self.config.decode(), str(self.url.child(CONFIG))).version_policy
        return set(policy.specific.versions) if policy.WhichOneof("policy_choice") == "specific" else self.versions


@dataclass(frozen=True)
class _Upload:
    name: str
    remote: _Remote
    stage: Path  # the complete new files, laid out as in the model directory
    version: int
    config: bytes
    owned: dict[str, Any]
    dropped: set[int]
    report: dict[str, Any]


class S3Repository:
    """The repository at ``url``: a boto3 client with errors turned into one-line PipelineErrors."""

    def __init__(self, url: S3Url) -> None:
        self.url = url
        self.client = s3_client(url)
        with self.errors():
            self.client.head_bucket(Bucket=url.bucket)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """S3 and connection errors as PipelineError naming the repository (never a credential)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            yield
        except NoCredentialsError:
            raise PipelineError(f"no AWS credentials found for {self.url}",
                                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment") from None
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket"):
                raise PipelineError(f"the bucket of {self.url} does not exist", f"create it first (aws s3 mb s3://{self.url.bucket})") from None
            raise PipelineError(f"S3 refused a request on {self.url}: {code or exc}",
                                "check the credentials' access to the bucket and AWS_ENDPOINT_URL") from None
        except BotoCoreError as exc:
            raise PipelineError(f"cannot reach the S3 store of {self.url}: {type(exc).__name__}",
                                "check AWS_ENDPOINT_URL (an S3-compatible store) and the network") from None

    def list(self, url: S3Url) -> dict[str, int]:
        """Every object under ``url`` (a folder), by key relative to it, with its size."""
        base = url.key() + "/" if url.key() else ""
        found: dict[str, int] = {}
        with self.errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=base):
                found |= {item["Key"][len(base):]: int(item["Size"]) for item in page.get("Contents", [])}
        return found

    def get(self, key: str) -> bytes:
        with self.errors():
            return bytes(self.client.get_object(Bucket=self.url.bucket, Key=key)["Body"].read())

    def put(self, key: str, data: bytes) -> None:
        with self.errors():
            self.client.put_object(Bucket=self.url.bucket, Key=key, Body=data)

    def upload(self, path: Path, key: str) -> None:
        with self.errors():
            self.client.upload_file(str(path), self.url.bucket, key, Callback=_uploaded)

    def delete(self, keys: Sequence[str]) -> None:
        with self.errors():
            for start in range(0, len(keys), 1000):
                batch = [{"Key": k} for k in keys[start:start + 1000]]
                self.client.delete_objects(Bucket=self.url.bucket, Delete={"Objects": batch, "Quiet": True})


def _uploaded(_bytes: int) -> None:
    """boto3's progress callback, called after each chunk of an upload (a large file goes up in parts)."""
    pause_point("publish.upload-bytes")  # tests hold a 2 GB upload here, part way through its data file, to kill it


def publish_s3_repository(
    artifacts: Sequence[Artifact],
    *,
    model: str,
    url: S3Url,
    configs: Mapping[str, ModelConfig],
    extra_files: Mapping[str, Mapping[str, bytes]] | None = None,
    version_policy: str = "new",
    report: Mapping[str, Any] | None = None,
    reproduce: str = "python -m pipeline build",
) -> list[str]:
    """Publish one Triton model per artifact into the repository at ``url`` (see the module docstring);
    return the URL of each new (or unchanged) version directory. Arguments as
    :func:`pipeline.triton.repository.publish_repository`."""
    extra_files = extra_files or {}
    names = checked_request(artifacts, model, configs, extra_files, version_policy)
    store = S3Repository(url)
    published: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pipeline-s3-publish-") as tmp:
        uploads = []
        for artifact, name in zip(artifacts, names):
            remote = _remote(store, url.child(name))
            _remove_partial(store, remote)
            files = extra_files.get(name, {})
            kept = _unchanged_version(store, remote, artifact, configs[name], files, version_policy)
            if kept is not None:
                log.info("%s unchanged: keeps serving version %d", name, kept)
                published[name] = str(remote.url.child(str(kept)))
                continue
            uploads.append(_staged(store, artifact, name, remote, Path(tmp) / name, configs[name], files, version_policy, report, reproduce))
        for item in uploads:  # every version directory whole before any config names one
            # Until its config names it, the new version is "uploading": a next publish removes it if this one dies.
            listed = sorted(item.remote.owned_files | set(item.owned["files"]))
            during = {"versions": sorted(item.remote.owned_versions), "files": listed, "uploading": item.version}
            store.put(item.remote.url.key(OWNED), json.dumps(during, indent=2).encode())
            for path in sorted(p for p in item.stage.rglob("*") if p.is_file() and p.relative_to(item.stage).as_posix() != CONFIG):
                pause_point("publish.upload")  # tests hold the publish here to kill it mid-upload (pipeline/core/pausepoints.py)
                store.upload(path, item.remote.url.key(path.relative_to(item.stage).as_posix()))
        for item in uploads:
            pause_point("publish.swap")
            store.put(item.remote.url.key(CONFIG), item.config)  # from here Triton loads the new version
            store.put(item.remote.url.key(OWNED), json.dumps(item.owned, indent=2).encode())
            store.put(item.remote.url.key(REPORT), json.dumps(item.report, indent=2, default=str).encode())
            store.delete([rel_key for v in sorted(item.dropped) for rel_key in _keys_of_version(item.remote, v)])
            published[item.name] = str(item.remote.url.child(str(item.version)))
            log.info("published %s version %d to %s", item.name, item.version, url)
    return [published[name] for name in names]


def pinned(cfg: ModelConfig, versions: Sequence[int]) -> ModelConfig:
    """A copy of ``cfg`` that serves exactly ``versions`` (Triton's ``specific`` version policy)."""
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    copy = ModelConfig()
    copy.CopyFrom(cfg)
    copy.version_policy.specific.versions[:] = sorted(versions)
    return copy


def _pinned_files(files: Mapping[str, bytes], version: int) -> dict[str, bytes]:
    """The extra files with per-profile configs (``configs/*.pbtxt``) pinned to ``version`` as well."""
    return {rel: config_text(pinned(parse_config(data.decode(), rel), [version])).encode() if rel.startswith("configs/") and rel.endswith(".pbtxt") else data
            for rel, data in files.items()}


def _remote(store: S3Repository, url: S3Url) -> _Remote:
    remote = _Remote(url, store.list(url))
    if OWNED in remote.sizes:
        try:
            record = json.loads(store.get(url.key(OWNED)))
            remote.owned_versions = {int(v) for v in record["versions"]}
            remote.owned_files = {str(f) for f in record["files"]}
            remote.uploading = int(record["uploading"]) if record.get("uploading") is not None else None
        except (ValueError, KeyError, TypeError):
            raise PipelineError(f"{url.child(OWNED)} is unreadable, so the pipeline cannot tell its files from yours",
                                f"restore it, or move {url} out of the repository and publish again") from None
    if CONFIG in remote.sizes:
        remote.config = store.get(url.key(CONFIG))
    return remote


def _keys_of_version(remote: _Remote, version: int) -> list[str]:
    return [remote.url.key(rel) for rel in sorted(remote.sizes) if rel.startswith(f"{version}/")]


def _remove_partial(store: S3Repository, remote: _Remote) -> None:
    """Delete the version a killed publish was uploading (not complete, not served), if any; adopt it into the
    record when its config already names it."""
    partial = remote.uploading
    if partial is not None and partial not in remote.owned_versions and partial in remote.served():
        # killed after its config named it: the version is whole, only its record was not finished
        remote.owned_versions.add(partial)
        remote.owned_files |= {rel for rel in remote.sizes if rel.startswith(f"{partial}/")}
    if partial is None or partial in remote.owned_versions:
        return
    keys = _keys_of_version(remote, partial)
    if keys:
        log.info("removing version %d of %s: the partial upload of a publish that did not finish", partial, remote.url)
        store.delete(keys)
    remote.sizes = {rel: size for rel, size in remote.sizes.items() if not rel.startswith(f"{partial}/")}
    remote.uploading = None


def _unchanged_version(store: S3Repository, remote: _Remote, artifact: Artifact, cfg: ModelConfig, files: Mapping[str, bytes], policy: str) -> int | None:
    """The served version if publishing would change nothing (same artifact hash, config and files), else None."""
    served = remote.served()
    if len(served) != 1 or REPORT not in remote.sizes:
        return None
    version = max(served)
    if version not in remote.owned_versions or (policy == "replace" and remote.owned_versions & remote.versions != {version}):
        return None
    try:
        entry = json.loads(store.get(remote.url.key(REPORT)))["versions"][str(version)]
        same = (entry["artifact"]["sha256"] == hash_path(Path(artifact.path))
                and entry["config_sha256"] == hashlib.sha256(config_text(cfg).encode()).hexdigest())
    except (ValueError, KeyError, TypeError):
        return None
    wanted = _pinned_files(files, version)
    extras = {rel for rel in remote.owned_files if not rel.split("/", 1)[0].isdigit()} - {CONFIG}
    if not same or extras != set(wanted) or remote.config != config_text(pinned(cfg, [version])).encode():
        return None
    return version if all(rel in remote.sizes and store.get(remote.url.key(rel)) == data for rel, data in wanted.items()) else None


def _staged(store: S3Repository, artifact: Artifact, name: str, remote: _Remote, stage: Path, cfg: ModelConfig, files: Mapping[str, bytes], policy: str,
            report: Mapping[str, Any] | None, reproduce: str) -> _Upload:
    """The new files of one model in a local folder, checked as Triton will load them, and what to record."""
    require(Path(artifact.path).exists(), f"artifact {artifact.path} does not exist", "rebuild it")
    existing = remote.versions
    version = max(existing | remote.owned_versions, default=0) + 1
    dropped = remote.owned_versions & existing if policy == "replace" else set()
    serving = pinned(cfg, [version])
    new_files = {CONFIG: config_text(serving).encode(), **_pinned_files(files, version)}
    for rel in new_files:
        require(rel not in remote.sizes or rel in remote.owned_files, f"{remote.url.child(rel)} was not written by the pipeline",
                "move or rename it; the pipeline never overwrites files it did not write")
    for v in sorted(dropped):
        foreign = [rel for rel in remote.sizes if rel.startswith(f"{v}/") and rel not in remote.owned_files]
        require(not foreign, f"{remote.url.child(str(v))} holds files the pipeline did not write ({', '.join(foreign[:3])})",
                f"move them out of {remote.url.child(str(v))}, then publish again")
    model_file = stage / str(version) / model_filename(cfg)
    model_file.parent.mkdir(parents=True)
    copy_artifact(Path(artifact.path), model_file)
    for rel, data in sorted(new_files.items()):
        write_synced(stage / rel, data)
    check_staged(stage, serving)
    kept = (remote.owned_versions - dropped) & existing
    version_files = {rel for rel in remote.owned_files if rel.split("/", 1)[0].isdigit() and int(rel.split("/", 1)[0]) in kept}
    mine = {p.relative_to(stage).as_posix() for p in model_file.parent.rglob("*") if p.is_file()}
    owned = {"versions": sorted(kept | {version}), "files": sorted(version_files | set(new_files) | mine)}
    previous: dict[str, Any] = {}
    if REPORT in remote.sizes:
        try:
            previous = dict(json.loads(store.get(remote.url.key(REPORT))).get("versions", {}))
        except (ValueError, AttributeError, TypeError):
            log.warning("ignoring unreadable %s", remote.url.child(REPORT))
    return _Upload(name, remote, stage, version, new_files[CONFIG], owned, dropped,
                   version_report(previous, kept, version, name, artifact, cfg, report, reproduce))


def local_copy(url: S3Url, dst: Path, *, model_files: bool = True) -> Path:
    """What Triton serves from ``url``, copied to the new folder ``dst``: every model's config and other
    files, its served version folders (only those its config names), and with ``model_files`` the newest
    served version's files. Commands that read a repository (verify, loadtest, deploy) read this copy."""
    store = S3Repository(url)
    listed = store.list(url)
    models = sorted({rel.split("/", 1)[0] for rel in listed if rel.count("/") >= 1 and not rel.startswith(".")})
    dst.mkdir(parents=True)
    for name in models:
        remote = _Remote(url.child(name), {rel.split("/", 1)[1]: size for rel, size in listed.items() if rel.startswith(name + "/")})
        if CONFIG in remote.sizes:
            remote.config = store.get(remote.url.key(CONFIG))
        served = remote.served() & remote.versions
        newest = max(served, default=None)
        for rel in sorted(remote.sizes):
            top = rel.split("/", 1)[0]
            if not top.isdigit() or (model_files and int(top) == newest):
                write_synced(dst / name / rel, store.get(remote.url.key(rel)))
        for version in served:
            (dst / name / str(version)).mkdir(parents=True, exist_ok=True)
    return dst


def readable_configs(repository: Path | S3Url, dst: Path) -> Path:
    """``repository`` as a folder whose configs can be read: itself, or an ``s3://`` one's configs copied to ``dst``."""
    return local_copy(repository, dst, model_files=False) if isinstance(repository, S3Url) else Path(repository)


@contextlib.contextmanager
def readable(repository: Path | S3Url, *, model_files: bool = True) -> Iterator[Path]:
    """``repository`` as a folder to read: itself, or for ``s3://`` a temporary :func:`local_copy` (removed after)."""
    if not isinstance(repository, S3Url):
        yield Path(repository)
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-s3-copy-") as tmp:
        yield local_copy(repository, Path(tmp) / "repository", model_files=model_files)


def serving_target(url: S3Url, local: Path, models: Sequence[str], config_name: str | None, *, gpu: bool) -> tuple[str, dict[str, str]]:
    """The URL a tritonserver reads ``url`` at (``local``: :func:`local_copy` of its configs) and the environment
    it needs for that (credentials: never its command line); PipelineError for ``models`` that ask for
    KIND_GPU instances without a GPU (Triton reads the bucket itself: its configs cannot be rewritten for a CPU)."""
    from pipeline.core.objectstore import server_environment
    from pipeline.triton.config import read_model_config

    if not gpu:
        needs = [m for m in models if any(g.kind == g.KIND_GPU for g in getattr(read_model_config(local / m, config_name), "instance_group", []))]
        require(not needs, f"{', '.join(needs)} in {url} ask for KIND_GPU instances and this machine has no GPU",
                "serve them on a GPU host, or copy the repository to a folder (aws s3 sync) and serve that: "
                "a local repository's GPU configs are served as KIND_CPU")
    env, target = server_environment(url)
    return target, env
