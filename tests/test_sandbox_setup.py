"""Per-snippet setup code (``run(code, setup=...)``, ``run_many(codes, setups=...)``) on both backends.

The setup is the caller's trusted code: it shares the snippet's globals, its stdout is hidden,
the snippet's traceback line numbers are unchanged, and a failing setup is ``setup_error``
(a caller bug), which the snippet itself cannot forge.  Docker cases are marked ``docker``.
"""

from __future__ import annotations

import pytest

from sandbox.config import SandboxConfig
from sandbox.docker_backend import DockerSandbox, docker_client, image_present
from sandbox.local import LocalSandbox
from sandbox.result import SandboxInfraError

CFG = dict(workers=2, timeout_s=1.0, wall_timeout_s=5.0, memory_mb=256, preimport=["math"], max_output_bytes=4096)


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def sb(request):
    if request.param == "local":
        box = LocalSandbox(SandboxConfig(backend="local", **CFG))
    else:
        try:
            client = docker_client(timeout=5)
        except SandboxInfraError as exc:
            pytest.skip(f"no Docker engine: {exc}")
        if not image_present(client, SandboxConfig().image):
            pytest.skip("Docker image missing: run `make sandbox-image`")
        box = DockerSandbox(SandboxConfig(backend="docker", **CFG), client=client)
    with box:
        yield box


def test_setup_shares_globals_and_its_stdout_is_hidden(sb):
    setup = "LIMIT = 7\ndef helper(x):\n    return x + 1\nprint('setup noise')"
    r = sb.run("print(helper(20))\nprint(LIMIT)", setup=setup)
    assert r.ok and r.stdout == "21\n7\n"


def test_snippet_traceback_lines_are_unchanged_by_setup(sb):
    r = sb.run("x = 1\nundefined_name", setup="a = 1\nb = 2\nc = 3\n")
    assert r.error_kind == "NameError"
    assert 'File "<string>", line 2, in <module>' in r.stderr
    assert "<setup>" not in r.stderr


@pytest.mark.parametrize("setup, last_line", [
    ("x = 1\nraise KeyError('boom')", "KeyError: 'boom'"),
    ("import sys\nsys.exit(0)", "SystemExit: 0"),
    ("def f(:\n    pass", "SyntaxError: invalid syntax"),
])
def test_failing_setup_is_setup_error_and_the_snippet_never_runs(sb, setup, last_line):
    r = sb.run("print('snippet ran')", setup=setup)
    assert not r.ok and r.error_kind == "setup_error"
    assert r.stdout == ""
    assert 'File "<setup>"' in r.stderr
    assert r.stderr.strip().splitlines()[-1] == last_line


def test_setup_that_does_not_finish_is_setup_error(sb):
    r = sb.run("print('snippet ran')", setup="import time\ntime.sleep(30)")
    assert r.error_kind == "setup_error" and r.timed_out
    assert r.stderr.endswith("setup did not finish: wall_timeout")


def test_setup_that_spins_is_setup_error_at_the_cpu_limit(sb):
    r = sb.run("print('snippet ran')", setup="while True:\n    pass")
    assert r.error_kind == "setup_error" and r.timed_out
    assert r.stderr.endswith("setup did not finish: timeout")


def test_snippet_cannot_forge_a_setup_error(sb):
    forge = "import os\nos.write(3, b'F')\nos.write(3, b'F')\nraise ValueError('mine')"
    r = sb.run(forge, setup="y = 2")
    assert r.error_kind == "ValueError"
    r = sb.run(forge)
    assert r.error_kind == "ValueError"


def test_run_many_aligns_setups_with_codes(sb):
    codes = ["print(a)", "print(a)", "print(a * 2)"]
    results = sb.run_many(codes, setups=["a = 1", None, "a = 'x'"])
    assert [r.stdout for r in results] == ["1\n", "", "xx\n"]
    assert results[1].error_kind == "NameError"
    with pytest.raises(ValueError, match="2 setups for 3 codes"):
        sb.run_many(codes, setups=["a = 1", None])


def test_setup_must_be_a_string(sb):
    with pytest.raises(TypeError, match="setup must be str or None"):
        sb.run("print(1)", setup=b"a = 1")
