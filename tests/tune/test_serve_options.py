"""`serve --restricted-api` takes its key from the environment, and refuses to start without one."""

from __future__ import annotations

from tests.conftest import cli, one_line_error


def test_restricted_api_without_a_key_is_one_line_and_starts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("serve", "--repository", str(tmp_path), "--model-control", "explicit", "--restricted-api",
               cwd=tmp_path, env={"TRITON_ADMIN_KEY": ""})
    line = one_line_error(proc)
    assert "--restricted-api needs the admin key in $TRITON_ADMIN_KEY" in line
    assert not (tmp_path / "build").exists()


def test_model_control_takes_only_the_modes_tritonserver_has() -> None:
    proc = cli("serve", "--model-control", "poll")
    assert proc.returncode == 2 and "invalid choice: 'poll'" in proc.stderr
