"""Who may use a share: only the node agent sets terms, a process is tied to its share by what the
kernel says of it (its session here, its pod's cgroup on Kubernetes), and telemetry is the agent's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.broker.process import REPO, BrokerProcess, control_path
from tests.agents.broker.test_protocol import Conn

CLAIM_ALL = b"HELLO v=1 share=%s gpu=GPU-t pid=1 request=1.0000 limit=1.0000 priority=high\n"

# A process of its own session (as another pod's is): says HELLO for the share it is given and
# prints the broker's answer.
HELLO_FROM_ANOTHER_SESSION = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(("HELLO v=1 share=%s gpu=GPU-t pid=1 request=0.5 limit=1 priority=low\\n" % sys.argv[2]).encode())
print(s.recv(4096).decode().strip())
print("closed" if s.recv(4096) == b"" else "open")
"""


def hello_in_new_session(broker: BrokerProcess, share: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", HELLO_FROM_ANOTHER_SESSION, str(broker.socket_path), share],
                         start_new_session=True, capture_output=True, text=True, timeout=30, check=True)
    answer, state = out.stdout.splitlines()
    return answer, state


def test_a_process_naming_another_reservations_share_is_refused(broker: BrokerProcess) -> None:
    # s1 is the test's (its session); the process below is another pod's, in a session of its own
    answer, state = hello_in_new_session(broker, "s1")
    assert answer.startswith("ERR refused:") and "not in share s1's sessions" in answer, answer
    assert state == "closed"
    stats = broker.query()
    assert stats["refused_hellos"] == 1
    assert stats["gpus"]["GPU-t"]["shares"]["s1"]["clients"] == 0
    assert "refused pid" in broker.log


def test_a_process_may_join_the_share_registered_for_it(broker: BrokerProcess) -> None:
    # a pod's process in a session of its own, which the agent registers for the share before it starts
    pod = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\n" + HELLO_FROM_ANOTHER_SESSION,
                            str(broker.socket_path), "theirs"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    broker.define("theirs", "GPU-t", request=0.3, limit=0.5, sessions=[pod.pid])
    out, _ = pod.communicate("go\n", timeout=30)
    assert out.splitlines()[0] == "OK v=1 window_ms=10000 drain=1"
    # and the test's own process, in its share: served too
    mine = Conn(broker)
    assert mine.ask(CLAIM_ALL % b"s1").startswith(b"OK v=1")
    assert mine.ask(b"ACQUIRE used_us=0 idle=0\n").startswith(b"GRANT quota_us=")
    mine.close()
    assert broker.query()["refused_hellos"] == 0


def test_what_a_process_claims_is_ignored_and_the_agents_terms_hold(broker: BrokerProcess) -> None:
    broker.define("small", "GPU-t", request=0.1, limit=0.2, priority="low")
    c = Conn(broker)
    assert c.ask(CLAIM_ALL % b"small").startswith(b"OK")  # it claims the whole GPU at high priority
    share = broker.query()["gpus"]["GPU-t"]["shares"]["small"]
    assert (share["request"], share["limit"], share["priority"], share["clients"]) == (0.1, 0.2, "low", 1)
    assert "request 0.100, limit 0.200, low priority, from the agent" in broker.log
    c.close()


def test_a_share_the_agent_did_not_name_is_refused(broker: BrokerProcess) -> None:
    c = Conn(broker)
    answer = c.ask(CLAIM_ALL % b"made-up")
    assert answer.startswith(b"ERR refused: share made-up has no terms on GPU GPU-t"), answer
    with pytest.raises((EOFError, ConnectionError)):
        c.line()
    assert "made-up" not in broker.query()["gpus"]["GPU-t"]["shares"]


def test_query_and_terms_are_refused_on_the_workloads_socket(broker: BrokerProcess) -> None:
    c = Conn(broker)
    assert c.ask(b"QUERY\n").startswith(b"ERR QUERY is answered to the node agent only")
    assert c.ask(b'TERMS {"shares":[]}\n').startswith(b"ERR unknown message")
    c.close()
    assert "s1" in broker.query()["gpus"]["GPU-t"]["shares"]  # the terms stand


def test_a_share_the_agent_drops_loses_its_processes(broker: BrokerProcess) -> None:
    c = Conn(broker)
    assert c.ask(CLAIM_ALL % b"s2").startswith(b"OK")
    broker.forget("s2", "GPU-t")
    assert c.line().startswith(b"ERR share s2 is no longer this process's")
    with pytest.raises((EOFError, ConnectionError)):
        c.line()
    assert "s2" not in broker.query()["gpus"]["GPU-t"]["shares"]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tessera-broker-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(script: str, *args: str) -> str:
    # the system interpreter: the test's virtual environment may be out of another user's reach
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
    return subprocess.run([python, "-c", script, *args], user=65534, capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_the_control_socket_refuses_other_users(open_dir: Path) -> None:
    probe = ("import contextlib, socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(10)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('denied')\n"
             "else:\n    with contextlib.suppress(OSError):\n        s.sendall(b'QUERY\\n')\n"
             "    print(s.recv(4096).decode().strip())\n")
    # the agent runs as the broker's user: the socket is 0600, another user cannot even connect
    same = BrokerProcess(open_dir / "same.sock", open_dir / "same.log").start()
    try:
        assert same.control_path.stat().st_mode & 0o777 == 0o600
        assert as_nobody(probe, str(same.control_path)) == "denied"
        # ...while the workloads' socket takes anyone's connection (HELLO decides)
        assert as_nobody(probe, str(same.socket_path)).startswith("ERR QUERY is answered to the node agent only")
    finally:
        same.stop()
    # an agent of another user (--agent-uid): the socket opens to all, the peer's uid decides
    other = BrokerProcess(open_dir / "other.sock", open_dir / "other.log", "--agent-uid", "4242").start()
    try:
        assert as_nobody(probe, str(other.control_path)) == "ERR refused: the control socket is the node agent's"
        assert other.query()["gpus"] == {}  # root (the test) is answered
    finally:
        other.stop()


def test_a_process_of_another_pod_is_refused_by_its_cgroup(tmp_path: Path) -> None:
    # --identity cgroup reads /proc/<peer pid>/cgroup under --proc-root; this test is the peer, and
    # its cgroup file says it is in pod A, as the kubelet's systemd layout names it
    pod_a, pod_b = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "11111111-2222-3333-4444-555555555555"
    proc = tmp_path / "proc" / str(os.getpid())
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_a.replace('-', '_')}.slice/"
        f"cri-containerd-{'ab' * 32}.scope\n")
    broker = BrokerProcess(tmp_path / "b.sock", tmp_path / "b.log", "--identity", "cgroup",
                           "--proc-root", str(tmp_path / "proc")).start()
    try:
        broker.define("job-a", "GPU-t", request=0.5, limit=1.0, sessions=[], pod_uid=pod_a)
        broker.define("job-b", "GPU-t", request=0.5, limit=1.0, sessions=[], pod_uid=pod_b)
        broker.define("job-c", "GPU-t", request=0.5, limit=1.0, sessions=[])  # its pod is not known yet
        mine = Conn(broker)
        assert mine.ask(CLAIM_ALL % b"job-a").startswith(b"OK")
        theirs = Conn(broker)
        answer = theirs.ask(CLAIM_ALL % b"job-b")
        assert answer == f"ERR refused: pid {os.getpid()} is in pod {pod_a}, not share job-b's".encode()
        assert Conn(broker).ask(CLAIM_ALL % b"job-c") == b"ERR refused: share job-c has no pod on this node yet"
        mine.close()
    finally:
        broker.stop()


def test_trusting_its_own_pod_needs_the_broker_to_be_in_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agents.broker", "--socket", str(tmp_path / "s"),
         "--control-socket", str(control_path(tmp_path / "s")), "--trust-own-pod",
         "--proc-root", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2 and "the broker is not in a pod" in result.stderr


def test_terms_are_validated(broker: BrokerProcess) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(broker.control_path))
        s.sendall(b'TERMS {"shares":[{"share":"x","gpu":"GPU-t","request":0.6,"limit":0.5,"priority":"low"}]}\n')
        assert s.recv(4096).startswith(b"ERR TERMS: shares.0: Value error, limit 0.5 is below request 0.6")
    assert "x" not in broker.query()["gpus"]["GPU-t"]["shares"]


THROUGH_READ_ONLY_MOUNT = """
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(path)
s.sendall(b"HELLO v=1 share=s1 gpu=GPU-t pid=1 request=0.5 limit=1 priority=low\\n")
print(s.recv(4096).decode().strip())
for attempt in (lambda: os.unlink(path), lambda: open(os.path.join(os.path.dirname(path), "planted"), "w")):
    try:
        attempt()
        print("written")
    except OSError as exc:
        print(exc.strerror)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare to mount")
def test_a_workload_reaches_the_socket_through_a_read_only_mount_but_cannot_replace_it(broker: BrokerProcess,
                                                                                      tmp_path: Path) -> None:
    # as the device plugin mounts the broker's directory into a container: read-only, and the
    # workload root inside it
    inside = tmp_path / "in-container"
    inside.mkdir()
    script = (f"mount --bind {broker.socket_path.parent} {inside} && mount -o remount,bind,ro {inside} && "
              f"exec {sys.executable} -c '{THROUGH_READ_ONLY_MOUNT}' {inside / broker.socket_path.name}")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount here: {out.stderr.strip()}")
    assert out.stdout.splitlines() == ["OK v=1 window_ms=10000 drain=1", "Read-only file system",
                                       "Read-only file system"], out.stderr
    assert broker.socket_path.is_socket()
