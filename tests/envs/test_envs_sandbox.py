"""The Python sandbox: real bubblewrap sandboxes running real programs, including escape attempts.

The escape tests run the sandbox from a separate "trainer" process where the attack aims at the
caller (kill it, read its environment). Network tests only ever aim at a listener on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from rlfactory.config import ConfigError
from rlfactory.envs import make_env
from rlfactory.envs import sandbox as sandbox_mod
from rlfactory.envs.code import python_tool
from rlfactory.envs.sandbox import SandboxUnavailable, check_sandbox, run_python, sandbox_support
from rlfactory.tools import TIMEOUT, ToolCall, ToolRunner, function_tool

SECRET = "sk-trainer-secret-4711"

# --- a normal program still works ----------------------------------------------------------------


def test_runs_code_and_reports_output_errors_and_exit_status():
    r = run_python("import sys\nprint(2 ** 70)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert r.stdout == "1180591620717411303424\n" and r.stderr == "oops\n" and r.exit_code == 3
    assert r.text() == "1180591620717411303424\nstderr:\noops\nexit status: 3"
    r = run_python("1 / 0")
    assert r.exit_code == 1 and r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert 'File "main.py", line 1' in r.stderr and "<string>" not in r.stderr  # no bootstrap frame


def test_imports_the_standard_library_and_reads_stdin():
    code = "import json, math, sys\nprint(json.dumps({'r': math.isqrt(10 ** 20), 'in': sys.stdin.read()}))"
    r = run_python(code, stdin="hello")
    assert r.ok and json.loads(r.stdout) == {"r": 10**10, "in": "hello"}


def test_kills_an_infinite_loop():
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and r.exit_code is None and not r.ok
    assert "timed out after 1 s" in r.text()


def test_memory_hogs_fail_with_memory_error():
    r = run_python("x = bytearray(2 * 1024 ** 3)", memory_mb=256)
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    r = run_python("a = []\nwhile True:\n    a.append(' ' * 10 ** 7)", memory_mb=256, timeout_s=10)
    assert not r.timed_out and "MemoryError" in r.stderr


def test_a_file_larger_than_max_file_mb_fails():
    r = run_python("open('big', 'wb').write(b'x' * (3 * 2 ** 20))", max_file_mb=2)
    assert r.exit_code == 1 and "File too large" in r.stderr


def test_output_is_capped():
    r = run_python("while True: print('x' * 1000)", timeout_s=1.0, max_output_chars=500)
    assert r.timed_out and r.truncated and len(r.stdout) == 500


def test_runs_in_a_fresh_tmp_of_its_own():
    code = ("import os, tempfile\nprint(os.getcwd(), os.environ['HOME'], tempfile.gettempdir())\n"
            "print(sorted(os.listdir('.')))\nopen('f.txt', 'w').write('hi')\nprint(sorted(os.listdir('.')))")
    first, second = run_python(code), run_python(code)
    # the interpreter's own folders, when they live under /tmp (a virtualenv there), are bound
    # read-only over the sandbox's /tmp: their top folder shows up in the listing
    from rlfactory.envs.sandbox_bwrap import _ro_paths

    own = sorted({p.split("/")[2] for p in _ro_paths() if p.startswith("/tmp/")})
    assert first.stdout == second.stdout == (f"/tmp /tmp /tmp\n{sorted(['main.py', *own])}\n"
                                             f"{sorted(['f.txt', 'main.py', *own])}\n")


def test_python_tool_through_tool_runner():
    async def go():
        async with ToolRunner([function_tool(python_tool(timeout_s=1.0))]) as runner:
            return runner.specs(), await runner.run([
                ToolCall("python", {"code": "print(6 * 7)"}),
                ToolCall("python", {"code": "while True: pass"}),
                ToolCall("python", {"code": "raise ValueError('bad')"}),
            ])

    specs, (ok, loop, err) = asyncio.run(go())
    assert specs[0].name == "python" and specs[0].parameters["required"] == ["code"]
    assert (ok.text, ok.is_error) == ("42", False)
    assert loop.is_error and loop.status == TIMEOUT
    assert err.is_error and "ValueError: bad" in err.text


# --- escapes: each of these worked against the old sandbox ---------------------------------------

TRAINER = """
import json, os, sys
from rlfactory.envs.sandbox import run_python
for code in json.loads(sys.stdin.read()):
    r = run_python(code, timeout_s=float(sys.argv[1]))
    print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}), flush=True)
"""


def run_in_trainer(*codes: str, timeout_s: float = 5.0, env: dict | None = None) -> tuple[int, list[dict]]:
    """Run each program through run_python in a fresh trainer process with a secret in its
    environment; returns the trainer's exit status and one result per program."""
    p = subprocess.run([sys.executable, "-c", TRAINER, str(timeout_s)], input=json.dumps(codes), text=True,
                       capture_output=True, env=dict(os.environ, RLF_API_KEY=SECRET, **(env or {})), timeout=120)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()]


def host_pids_with(token: str) -> list[int]:
    """Host processes whose command line holds `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture()
def token():
    """A unique marker for the command lines of processes a test starts inside the sandbox; kills
    any that are still alive at the end (they would be an escape)."""
    tok = f"rlf-sandbox-test-{uuid.uuid4().hex}"
    yield tok
    for pid in host_pids_with(tok):
        os.kill(pid, signal.SIGKILL)


def spawn_marked(token: str, *, setsid: bool) -> str:
    """Code that double-forks a sleeping python whose argv holds `token` (in a new session if asked),
    detached from the sandbox's stdin/stdout/stderr as a daemon would be, and prints 'daemon started'
    once that python runs (the pipe's write end closes on its exec)."""
    return textwrap.dedent(f"""
        import os, sys
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            {"os.setsid()" if setsid else "pass"}
            if os.fork() == 0:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {token!r}])
            os._exit(0)
        os.close(w)
        os.wait()
        os.read(r, 1)
        print("daemon started", flush=True)
    """)


@pytest.mark.slow
def test_the_sandbox_cannot_kill_the_trainer():
    code = ("import os\nfor pid in (os.getppid(), {trainer}):\n    try:\n        os.kill(pid, 9)\n"
            "    except OSError as e:\n        print(type(e).__name__)")
    trainer = ("import os, sys\nfrom rlfactory.envs.sandbox import run_python\n"
               f"r = run_python({code!r}.format(trainer=os.getpid()))\nprint('trainer alive', r.exit_code)")
    p = subprocess.run([sys.executable, "-c", trainer], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "trainer alive 0" in p.stdout, (p.returncode, p.stderr[-500:])


@pytest.mark.slow
def test_the_trainer_environment_and_processes_are_invisible():
    code = textwrap.dedent("""
        import os
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        leaks = []
        for p in pids:
            try:
                leaks += [p] if b'sk-trainer-secret' in open(f'/proc/{p}/environ', 'rb').read() else []
            except OSError:
                pass
        print(len(pids), leaks, sorted(os.environ))
    """)
    rc, (r, parent) = run_in_trainer(code, "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())")
    assert rc == 0 and SECRET not in json.dumps(r) + json.dumps(parent)
    n_pids, leaks, names = r["stdout"].split(" ", 2)
    assert int(n_pids) <= 3 and leaks == "[]", r  # its init, itself, at most one more
    assert "RLF_API_KEY" not in names and "PATH" in names


def test_host_files_are_invisible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    here = os.path.abspath(__file__)
    for path in (str(secret), here, "/etc/shadow", "/root/.bashrc", os.path.expanduser("~/.bashrc")):
        r = run_python(f"print(open({path!r}).read())")
        assert r.exit_code == 1 and ("FileNotFoundError" in r.stderr or "PermissionError" in r.stderr), (path, r)
    r = run_python(f"import os\nprint(sorted(os.listdir('/')), os.path.exists({str(tmp_path)!r}))")
    assert "'tmp'" in r.stdout and "'home'" not in r.stdout and r.stdout.rstrip().endswith("False")


def test_writes_never_reach_the_host(tmp_path):
    name = f"rlf-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", str(tmp_path / name), f"/usr/{name}", f"/{name}", f"/dev/{name}"]
    code = "\n".join(f"try:\n    open({t!r}, 'w').write('x')\nexcept OSError as e:\n    print(e.strerror)"
                     for t in targets)
    r = run_python(code)
    try:
        assert [t for t in targets if os.path.exists(t)] == [], r.text()
        assert r.stdout.count("Read-only file system") + r.stdout.count("No such file") == len(targets) - 1
    finally:  # what an escape left on the host
        for t in targets:
            if os.path.exists(t):
                os.remove(t)


def test_subprocesses_run_unprivileged_as_seen_from_the_host(token):
    """The sandbox may start processes, but never as the trainer's (root) user or with capabilities."""
    code = (f"import subprocess, sys\np = subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', "
            f"{token!r}])\nprint('child ended by', p.returncode)")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(run_python, code, timeout_s=60.0)
        status = None
        while status is None and not pending.done():
            for pid in host_pids_with(token):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
                    os.kill(pid, signal.SIGKILL)  # seen: end the program early
                except OSError:
                    pass
        r = pending.result()
    assert status is not None and r.stdout == "child ended by -9\n", r.text()
    host_uid = int(status["Uid"].split()[0])
    assert host_uid != 0 and (os.geteuid() == 0 or host_uid == os.geteuid())
    assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"


def test_a_fork_bomb_hits_the_process_limit():
    code = textwrap.dedent("""
        import os, time
        n = 0
        try:
            for _ in range(400):
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError as e:
            print(e.strerror)
        print(n)
    """)
    r = run_python(code, timeout_s=10.0)
    assert r.stdout.splitlines()[0] == "Resource temporarily unavailable" and int(r.stdout.split()[-1]) < 64, r.text()


def test_total_disk_is_limited():
    code = textwrap.dedent("""
        written = 0
        for n, d in enumerate(('.', '/tmp', '/dev/shm')):
            try:
                for i in range(10):
                    with open(f'{d}/big{n}-{i}', 'wb') as f:
                        for _ in range(15):
                            f.write(b'x' * 2 ** 20)
                            written += 1
            except OSError as e:
                print(d, e.strerror)
        print(written)
    """)
    r = run_python(code, timeout_s=20.0)
    lines = r.stdout.splitlines()
    assert lines[0] == ". No space left on device" and lines[-2] == "/dev/shm No space left on device", r.text()
    assert int(lines[-1]) <= 64 + 4  # /tmp's 64 MB (cwd is /tmp) plus /dev/shm's 4 MB, not 150 MB


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["exits", "times out"])
def test_a_setsid_grandchild_dies_with_the_sandbox(token, ending):
    code = spawn_marked(token, setsid=True) + ("while True: pass" if ending == "times out" else "")
    r = run_python(code, timeout_s=4.0)
    assert r.timed_out == (ending == "times out") and r.stdout == "daemon started\n", r.text()
    assert host_pids_with(token) == []  # gone when run_python returns, without waiting


@pytest.mark.slow
def test_the_sandbox_dies_with_a_killed_trainer(token):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    trainer.stdin.write(json.dumps([spawn_marked(token, setsid=True) + "import time\ntime.sleep(60)"]))
    trainer.stdin.close()
    deadline = time.monotonic() + 60
    while not host_pids_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids_with(token), "the sandboxed program never started"
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously; it must arrive
    while host_pids_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids_with(token) == []


@pytest.fixture()
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


def network_attacks(port: int) -> dict[str, str]:
    """Ways around a Python-level socket patch, each printing 'connected' if it reaches 127.0.0.1:port."""
    return {
        "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
        "re-imported _socket": textwrap.dedent(f"""
            import importlib.util, sys
            for m in ('socket', '_socket'):
                sys.modules.pop(m, None)
            spec = importlib.util.find_spec('_socket')
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            s = m.socket(2, 1)
            s.settimeout(2)
            s.connect(('127.0.0.1', {port}))
            print('connected')
        """),
        "ctypes": textwrap.dedent(f"""
            import ctypes, struct
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.socket(2, 1, 0)
            addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)
            print('connected' if libc.connect(fd, addr, len(addr)) == 0 else f'errno {{ctypes.get_errno()}}')
        """),
        "subprocess": textwrap.dedent(f"""
            import subprocess, sys
            code = "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
            print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout)
        """),
    }


@pytest.mark.slow
def test_the_network_is_unreachable_even_when_the_old_fallback_is_forced(listener):
    # The listener is reachable from here; no way of connecting reaches it from the sandbox, even
    # with the variable that forced the old socket-patch fallback set in the trainer.
    socket.create_connection(("127.0.0.1", listener), timeout=2).close()
    attacks = network_attacks(listener)
    rc, results = run_in_trainer(*attacks.values(), env={"RLFACTORY_SANDBOX_NETWORK": "socket-patch"})
    assert rc == 0 and len(results) == len(attacks)
    for name, r in zip(attacks, results):
        assert "connected" not in r["stdout"], (name, r)


# --- where the strict sandbox cannot run ----------------------------------------------------------


@pytest.fixture()
def fresh_probe(monkeypatch):
    sandbox_support.cache_clear()
    yield monkeypatch
    sandbox_support.cache_clear()


def test_strict_refuses_to_run_without_bubblewrap(fresh_probe):
    fresh_probe.setattr(sandbox_mod, "BWRAP", "rlf-no-such-bwrap")
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap \(rlf-no-such-bwrap\) is not installed.*sandbox: weak"):
        run_python("print(1)")
    with pytest.raises(SandboxUnavailable) as e:
        make_env("code", n_train=2, n_test=1).tools()  # at start-up, where the runner is built
    assert isinstance(e.value, ConfigError)  # the CLI prints it as one line and exits with 2


@pytest.fixture()
def public_dir():
    """A directory that uid 65534 can reach too (pytest's tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="rlf-sandbox-test-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path)


def test_strict_refuses_where_the_kernel_refuses_namespaces(fresh_probe, public_dir):
    # Stands in for bwrap on a kernel without unprivileged user namespaces: fails as bwrap does there.
    fake = public_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    fresh_probe.setattr(sandbox_mod, "BWRAP", str(fake))
    with pytest.raises(SandboxUnavailable) as e:
        check_sandbox("strict")
    assert str(e.value) == ("refusing to run model-written code: bwrap could not build the sandbox: bwrap: No "
                            "permissions to create new namespace. To run it without isolation anyway, set "
                            "env.options.sandbox: weak (unsafe)").replace("bwrap could", f"{fake} could")


def test_weak_mode_is_chosen_by_name_and_says_so(fresh_probe, capsys):
    fresh_probe.setattr(sandbox_mod, "BWRAP", "rlf-no-such-bwrap")
    sandbox_mod._warn_weak.cache_clear()
    env = make_env("code", n_train=2, n_test=1, sandbox="weak")
    env.tools()
    env.tools()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("rlfactory: WARNING: sandbox: weak: model-written code runs WITHOUT isolation")
    r = run_python("import math\nprint(math.factorial(20))", mode="weak")
    assert r.ok and r.stdout == "2432902008176640000\n"
    assert run_python("while True: pass", mode="weak", timeout_s=0.5).timed_out
    with pytest.raises(ValueError, match="env.options.sandbox='loose'"):
        make_env("code", sandbox="loose")



def test_a_python_under_tmp_is_bound_after_the_sandboxes_own_tmp():
    """bwrap mounts in order: a virtualenv under /tmp must be bound after the sandbox's /tmp tmpfs
    (before this, a clone in /tmp could not start its own interpreter in the sandbox)."""
    from rlfactory.envs.sandbox_bwrap import Layout, bwrap_command

    layout = Layout((("/usr", "/usr"), ("/tmp/clone/.venv", "/tmp/clone/.venv")), (), (), None)
    argv = bwrap_command("bwrap", layout, code_fd=3, info_fd=4, disk_bytes=1 << 20)
    assert argv.index("/usr") < argv.index("/tmp/main.py") < argv.index("/tmp/clone/.venv") < argv.index("--remount-ro")
