"""Loopback servers for tests: a free port, and a server process started, awaited and stopped."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(argv: Sequence[str], ready_url: str, *, timeout_s: float = 60) -> Iterator[subprocess.Popen]:
    """Start `argv`, wait until `ready_url` answers (failing the test with the process's last stderr
    if it exits or `timeout_s` passes first), yield the process, and stop it afterwards."""
    # stderr goes to a file, not a pipe: a chatty server (llama_cpp.server) would fill a pipe and block
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                urllib.request.urlopen(ready_url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    proc.kill()
                    proc.wait(timeout=30)
                    log.seek(0)
                    err = log.read().decode(errors="replace")[-500:]
                    pytest.fail(f"{argv[2] if len(argv) > 2 else argv[0]} did not start: {err}")
                time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
