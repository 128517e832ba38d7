"""The sandbox's limits in aggregate (memory of all its processes together) and the weak mode's
confinement, with real sandboxes running real programs. The memory attacks run from a separate
"trainer" process, so that an OOM kill reaching past the sandbox would show as a dead trainer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

import rlfactory
from rlfactory.envs import sandbox_cgroup, sandbox_proc, sandbox_weak
from rlfactory.envs.sandbox import run_python
from rlfactory.envs.sandbox_cgroup import CgroupHome, cgroup_home

HAVE_CGROUP = isinstance(cgroup_home(), CgroupHome)

TRAINER = """
import json, sys
from rlfactory.envs.sandbox import run_python
code, kwargs = json.loads(sys.stdin.read())
r = run_python(code, **kwargs)
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code, "killed": r.killed,
                  "timed_out": r.timed_out}), flush=True)
"""


def run_in_trainer(code: str, **kwargs) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-c", TRAINER], input=json.dumps([code, kwargs]), text=True,
                       capture_output=True, timeout=120)
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else None), p.stderr[-2000:]


def host_pids_with(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture()
def token():
    tok = f"rlf-sandbox-limits-{uuid.uuid4().hex}"
    yield tok
    for pid in host_pids_with(tok):  # survivors are a failure (asserted in the tests); do not leave them
        os.kill(pid, signal.SIGKILL)


@pytest.fixture()
def no_cgroup(monkeypatch):
    """This machine as one where no cgroup can be made (a user without delegation)."""
    monkeypatch.setattr(sandbox_proc, "cgroup_home", lambda: "no cgroup (test)")


def forks_of(token: str, n: int, mb: int) -> str:
    """A program that starts `n` processes (argv marked with `token`) each touching `mb` MB, then waits."""
    child = (f"b = bytearray({mb} * 2 ** 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
             "print('full', flush=True)\nimport time\ntime.sleep(60)")
    return textwrap.dedent(f"""
        import subprocess, sys
        kids = []
        for _ in range({n}):
            try:
                kids.append(subprocess.Popen([sys.executable, '-c', {child!r}, {token!r}]))
            except OSError as e:
                print('start failed:', e.strerror, flush=True)
        print('started', len(kids), flush=True)
        print('exits', sorted(k.wait() for k in kids), flush=True)
    """)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_CGROUP, reason=f"no cgroup can be made here: {cgroup_home()}")
@pytest.mark.parametrize("mode", ["strict", "weak"])
def test_forks_past_the_memory_budget_kill_the_whole_sandbox_not_the_trainer(token, mode):
    """6 processes x 400 MB with memory_mb=512: each is under its rlimit, together far over. The
    sandbox's cgroup runs out of memory; every process of it is killed, the trainer lives on."""
    rc, r, err = run_in_trainer(forks_of(token, 6, 400), memory_mb=512, timeout_s=60.0, mode=mode)
    assert rc == 0 and r is not None, f"the trainer died ({rc}): {err}"
    assert r["killed"] and r["killed"].startswith("out of memory: its processes together passed memory_mb=512"), r
    assert not r["timed_out"] and "exits" not in r["stdout"], r  # killed before its children ended
    assert host_pids_with(token) == []


@pytest.mark.slow
def test_without_a_cgroup_the_limit_is_split_among_fewer_processes(token, no_cgroup):
    """No cgroup: memory_mb=512 becomes 4 shares of 128 MB (bwrap, and 3 processes or threads in the
    sandbox: its init, the program, one more), so six 400 MB processes cannot happen."""
    r = run_python(forks_of(token, 6, 400), memory_mb=512, timeout_s=60.0)
    assert r.stdout.count("start failed: Resource temporarily unavailable") == 5, r.text()
    assert "exits [1]" in r.stdout and "MemoryError" in r.stderr and r.killed is None, r.text()
    r = run_python("b = bytearray(100 * 2 ** 20)\nprint(len(b))", memory_mb=512)
    assert r.ok and r.stdout == f"{100 * 2 ** 20}\n", r.text()  # one share is still usable
    assert host_pids_with(token) == []


@pytest.mark.skipif(not HAVE_CGROUP, reason=f"no cgroup can be made here: {cgroup_home()}")
def test_cgroups_left_by_a_killed_trainer_are_removed_at_the_next_start():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = os.path.join(cgroup_home().memory, f"{sandbox_cgroup.PREFIX}{dead}-feedbeef")
    ours = os.path.join(cgroup_home().memory, f"{sandbox_cgroup.PREFIX}{os.getpid()}-feedbeef")
    os.mkdir(stale)
    os.mkdir(ours)
    try:
        cgroup_home.cache_clear()
        assert isinstance(cgroup_home(), CgroupHome)
        assert not os.path.exists(stale) and os.path.exists(ours)  # a live trainer's cgroup stays
    finally:
        for d in (stale, ours):
            if os.path.exists(d):
                os.rmdir(d)


def test_strict_says_at_start_up_when_memory_mb_is_split(no_cgroup, capsys):
    from rlfactory.envs import sandbox

    sandbox._note_no_cgroup.cache_clear()
    try:
        sandbox.check_sandbox("strict")
        sandbox.check_sandbox("strict")
        (line,) = capsys.readouterr().err.splitlines()
        assert line == ("rlfactory: sandbox: memory_mb is split into 128 MB shares among fewer processes "
                        "(no cgroup here: no cgroup (test))")
    finally:
        sandbox._note_no_cgroup.cache_clear()


def test_a_killed_sandbox_says_why():
    r = sandbox_proc.SandboxResult("", "", 137, False, 5.0, killed="out of memory: x")
    assert not r.ok and r.text() == "error: killed: out of memory: x"


# --- the weak mode ---------------------------------------------------------------------------------


def test_weak_mode_cannot_write_the_venv_the_checkout_or_the_cache(capsys):
    """Where a mount namespace can be made the weak sandbox writes only its temp dir; where not,
    its warning says plainly that it can write them."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(rlfactory.__file__)))
    places = [sys.prefix, checkout, os.path.expanduser("~/.cache"), "/tmp", "."]
    name = f"rlf-weak-write-{uuid.uuid4().hex}"
    code = "\n".join(f"try:\n    open({os.path.join(p, name)!r}, 'w').write('x')\n    print('wrote')\n"
                     f"except OSError as e:\n    print(e.strerror)" for p in places)
    try:
        r = run_python(code, mode="weak")
        written = [p for p in places[:-1] if os.path.exists(os.path.join(p, name))]
    finally:
        for p in places[:-1]:
            if os.path.exists(os.path.join(p, name)):
                os.remove(os.path.join(p, name))
    if sandbox_weak.weak_confinement() & sandbox_weak._CLONE_NEWNS:
        assert r.stdout.splitlines() == ["Read-only file system"] * 4 + ["wrote"] and written == [], r.text()
    else:
        assert "it can WRITE what this user can (the virtual environment, the checkout" in sandbox_weak.weak_summary()


def test_weak_mode_multiprocessing_still_works():
    """Its own /dev/shm (the host's is read-only there): a multiprocessing pool needs one."""
    r = run_python("import multiprocessing\nwith multiprocessing.Pool(2) as p:\n    print(p.map(abs, [-1, -2]))",
                   mode="weak", timeout_s=20.0)
    assert r.ok and r.stdout == "[1, 2]\n", r.text()


@pytest.mark.parametrize("ending", ["exits", "times out"])
@pytest.mark.parametrize("cgroup", ["cgroup", "no cgroup"])
def test_weak_mode_kills_a_setsid_child_that_holds_stdout(token, ending, cgroup, request):
    """Before: the call waited for the pipes 5 s more and the child lived on."""
    if cgroup == "no cgroup":
        request.getfixturevalue("no_cgroup")
    elif not HAVE_CGROUP:
        pytest.skip(f"no cgroup can be made here: {cgroup_home()}")
    code = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}], start_new_session=True)
        print('started', flush=True)
    """) + ("while True:\n    pass\n" if ending == "times out" else "")
    t0 = time.monotonic()
    r = run_python(code, mode="weak", timeout_s=2.0)
    took = time.monotonic() - t0
    assert r.stdout == "started\n" and r.timed_out == (ending == "times out"), r.text()
    assert "output lost" not in r.stderr and took < 2.0 + 1.5, (took, r.text())
    assert host_pids_with(token) == []  # gone when run_python returns, without waiting


def test_weak_mode_reports_a_signal_as_in_strict_mode():
    r = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", mode="weak")
    assert r.exit_code == 128 + 9 and r.text() == "exit status: 137"


AS_NOBODY = """
import asyncio, importlib.util, json, os, sys, types
root, outside, token = sys.argv[1:4]
# the weak sandbox's modules (and the process helpers they use) only need the standard library
for name in ("rlfactory", "rlfactory.envs", "rlfactory.tools"):
    m = types.ModuleType(name)
    m.__path__ = []
    sys.modules[name] = m
for mod in ("tools.process", "envs.sandbox_cgroup", "envs.sandbox_proc", "envs.sandbox_weak"):
    spec = importlib.util.spec_from_file_location(f"rlfactory.{mod}", f"{root}/rlfactory/{mod.replace('.', '/')}.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
weak = sys.modules["rlfactory.envs.sandbox_weak"]
code = (f"import os, subprocess, sys\\ntry:\\n    open({outside!r}, 'w')\\n"
        f"except OSError as e:\\n    print(e.strerror)\\n"
        f"open('here', 'w').write('1')\\nprint(os.getuid(), os.listdir('.'))\\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}], start_new_session=True)\\n"
        f"try:\\n    print(subprocess.Popen([sys.executable, '-c', 'pass']).wait())\\n"
        f"except OSError as e:\\n    print(e.strerror)")
r = asyncio.run(weak.arun_weak(code, timeout_s=10, memory_mb=512, max_output_chars=2000, max_file_mb=16,
                               max_processes=64, stdin=""))
print(json.dumps({"summary": weak.weak_summary(), "stdout": r.stdout, "stderr": r.stderr, "exit": r.exit_code}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3") or not shutil.which("setpriv"),
                    reason="needs root (to become uid 65534), setpriv and a system /usr/bin/python3")
def test_weak_mode_as_an_unprivileged_user(token, tmp_path):
    """As uid 65534 (no cgroup of its own to make): a user namespace makes the mount and network
    namespaces, files are read-only but for the temp dir, memory_mb is split, leftovers are killed."""
    public = tempfile.mkdtemp(prefix="rlf-weak-nobody-")
    try:
        os.chmod(public, 0o777)
        script = os.path.join(public, "probe.py")
        with open(script, "w") as f:
            f.write(AS_NOBODY)
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(rlfactory.__file__)))
        p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                            "-I", script, checkout, os.path.join(public, "outside"), token],
                           capture_output=True, text=True, timeout=120, cwd=public)
        assert p.returncode == 0, p.stderr[-2000:]
        r = json.loads(p.stdout.splitlines()[-1])
        if "files read-only" not in r["summary"]:  # no unprivileged user namespaces on this kernel: said plainly
            assert "it can WRITE what this user can" in r["summary"]
            return
        # split (no cgroup for this user): 4 shares of 128 MB, 3 processes in its user namespace (the
        # supervisor, the program, the sleeper), so a 4th is refused
        split = "memory_mb is split into 128 MB shares" in r["summary"]
        last = "Resource temporarily unavailable" if split else "0"
        assert r["stdout"] == f"Read-only file system\n65534 ['main.py', 'here']\n{last}\n", r
        assert not os.path.exists(os.path.join(public, "outside")) and host_pids_with(token) == []
    finally:
        shutil.rmtree(public, ignore_errors=True)
