"""The broker as a process: the wire protocol, bad input, clients that vanish or go silent."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.agents.broker.process import BrokerProcess
from tests.waiting import wait_for

HELLO = b"HELLO v=1 share=%s gpu=GPU-t pid=%d request=0.5 limit=1.0 priority=low\n"


class Conn:
    def __init__(self, broker: BrokerProcess) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(str(broker.socket_path))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self, timeout: float = 5) -> bytes:
        self.sock.settimeout(timeout)
        while b"\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def ask(self, data: bytes) -> bytes:
        self.send(data)
        return self.line()

    def close(self) -> None:
        self.sock.close()


def test_hello_acquire_grant_release(broker: BrokerProcess) -> None:
    c = Conn(broker)
    assert c.ask(HELLO % (b"s1", 11)) == b"OK v=1 window_ms=10000 drain=1"
    grant = c.ask(b"ACQUIRE used_us=0 idle=0\n")
    assert grant.startswith(b"GRANT quota_us=")
    quota_us = int(grant.split(b"=")[1])
    assert 2000 <= quota_us <= 50000
    time.sleep(quota_us / 1e6)
    c.send(b"RELEASE used_us=%d idle=0\n" % quota_us)
    # RELEASE has no answer: wait until the broker has counted it.
    wait_for(lambda: broker.query()["gpus"]["GPU-t"]["shares"]["s1"]["used_total_s"] > 0, 10, "the release")
    shares = broker.query()["gpus"]["GPU-t"]["shares"]
    assert shares["s1"]["used_total_s"] == pytest.approx(quota_us / 1e6, rel=0.01)
    assert shares["s1"]["clients"] == 1
    c.close()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"GIMME\n", b"unknown message"),
        (b"HELLO v=2 share=a gpu=g pid=1 request=0.5 limit=1 priority=low\n", b"protocol version"),
        (b"HELLO v=1 share=a gpu=g pid=1 request=0.5 limit=0.4 priority=low\n", b"exceeds limit"),
        (b"HELLO v=1 share=a gpu=g pid=1 request=nan limit=1 priority=low\n", b"request must be in"),
        (b"HELLO v=1 share=a gpu=g pid=1 request=0.5 limit=1 priority=top\n", b"priority must be"),
        (b"HELLO v=1 share=../x gpu=g pid=1 request=0.5 limit=1 priority=low\n", b"share must be"),
        (b"HELLO v=1 share=a gpu=g request=0.5 limit=1 priority=low\n", b"missing pid"),
        (b"HELLO v=1 share=a gpu=g pid=-4 request=0.5 limit=1 priority=low\n", b"pid must be"),
        (b"ACQUIRE used_us=0 idle=0\n", b"send HELLO first"),
        (b"ACQUIRE used_us=abc idle=0 extra=1\n", b"has no field"),
        (b"\xff\xfe\n", b"not ASCII"),
        (b"RELEASE used_us=99999999999999 idle=0\n", b"used_us must be between"),
    ],
)
def test_bad_messages_are_rejected_and_the_broker_lives_on(
    broker: BrokerProcess, line: bytes, reason: bytes
) -> None:
    c = Conn(broker)
    if line.startswith(b"RELEASE"):
        c.ask(HELLO % (b"s1", 1))
    answer = c.ask(line)
    assert answer.startswith(b"ERR ") and reason in answer, answer
    assert broker.query()["rejected_lines"] >= 1
    assert "rejected a message" in broker.log
    c.close()


def test_an_overlong_line_closes_only_that_connection(broker: BrokerProcess) -> None:
    c = Conn(broker)
    c.send(b"A" * 5000 + b"\n")
    assert c.line().startswith(b"ERR line longer")
    with pytest.raises((EOFError, ConnectionError)):
        c.line()
    assert broker.query()["rejected_lines"] == 1


def test_garbage_and_abrupt_disconnects_do_not_hurt_others(broker: BrokerProcess) -> None:
    for junk in [b"\x00" * 100, b"HELLO", b"\n\n\n", b"ACQUIRE used_us=1 idle=1"]:
        c = Conn(broker)
        c.send(junk)
        c.close()
    good = Conn(broker)
    assert good.ask(HELLO % (b"s2", 5)).startswith(b"OK")
    assert good.ask(b"ACQUIRE used_us=0 idle=0\n").startswith(b"GRANT")
    good.close()


def test_a_silent_holder_loses_its_token(broker: BrokerProcess) -> None:
    a, b = Conn(broker), Conn(broker)
    a.ask(HELLO % (b"sa", 1))
    b.ask(HELLO % (b"sb", 2))
    assert a.ask(b"ACQUIRE used_us=0 idle=0\n").startswith(b"GRANT")
    b.send(b"ACQUIRE used_us=0 idle=0\n")
    assert b.line().startswith(b"GRANT")  # a never answered
    assert broker.query()["gpus"]["GPU-t"]["revocations"] == 1  # taken from a, not given back
    a.close()
    b.close()


def test_a_holder_that_dies_hands_the_token_on_at_once(broker: BrokerProcess) -> None:
    a, b = Conn(broker), Conn(broker)
    a.ask(HELLO % (b"sa", 1))
    b.ask(HELLO % (b"sb", 2))
    a.ask(b"ACQUIRE used_us=0 idle=0\n")
    b.send(b"ACQUIRE used_us=0 idle=0\n")
    a.close()
    assert b.line().startswith(b"GRANT")
    stats = broker.query()["gpus"]["GPU-t"]
    assert stats["revocations"] == 0  # handed on when a went, not taken after its quota ran out
    assert stats["shares"]["sa"]["clients"] == 0
    b.close()


def test_the_command_line_rejects_bad_settings(tmp_path) -> None:
    import subprocess
    import sys

    from tests.agents.broker.process import REPO

    result = subprocess.run(
        [sys.executable, "-m", "agents.broker", "--socket", str(tmp_path / "s"), "--control-socket",
         str(tmp_path / "c"), "--min-quota-ms", "80"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert "quotas must satisfy" in result.stderr


def test_sigterm_ends_the_broker_and_removes_its_socket(broker: BrokerProcess) -> None:
    broker.stop(signal.SIGTERM)
    assert broker.proc.returncode == 0
    assert not broker.socket_path.exists() and not broker.control_path.exists()
