"""Real object stores on free local ports: moto's S3 server and gcp-storage-emulator.

Started once per test session; the standard variables (`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`) point
our code (and any child process) at them, as they would point it at the real clouds' endpoints.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from browser_fixtures import free_port

_names = itertools.count()


class Emulators:
    def __init__(self, s3_process: bool = False):
        """`s3_process`: moto in a process of its own (the bench: its CPU is not the measured process's)."""
        from gcp_storage_emulator.server import create_server
        from moto.server import ThreadedMotoServer

        self.s3_port = free_port()
        if s3_process:
            exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
            self.s3 = _Process([exe, "-H", "127.0.0.1", "-p", str(self.s3_port)], self.s3_port)
        else:
            self.s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=self.s3_port, verbose=False)
            self.s3.start()
        self.gcs_port = free_port()
        self.gcs = create_server("127.0.0.1", self.gcs_port, in_memory=True)
        self.gcs.start()
        self.env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self.gcs_port}",
        }

    def stop_s3(self) -> None:
        self.s3.stop()

    def start_s3(self) -> None:
        """S3 again on the same port (moto keeps its buckets in this process across servers)."""
        from moto.server import ThreadedMotoServer

        self.s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=self.s3_port, verbose=False)
        self.s3.start()

    def new_bucket(self, scheme: str) -> str:
        """A fresh empty bucket; its runs dir URL (with a prefix, as a lab's would have)."""
        name = f"obs-{next(_names)}-{secrets.token_hex(3)}"
        if scheme == "s3":
            import s3fs

            s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
        else:
            from gcsfs.core import GCSFileSystem

            GCSFileSystem(skip_instance_cache=True, token="anon").mkdir(name)
        return f"{scheme}://{name}/lab/runs"

    def close(self) -> None:
        self.s3.stop()
        self.gcs.stop()


class _Process:
    def __init__(self, argv: list[str], port: int):
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{argv[0]} did not listen on port {port}")

    def stop(self) -> None:
        self.p.terminate()
        self.p.wait(10)


@contextmanager
def running(s3_process: bool = False) -> Iterator[Emulators]:
    """Both emulators, the standard variables pointing at them meanwhile (and in child processes)."""
    em = Emulators(s3_process)
    old = {k: os.environ.get(k) for k in em.env}
    os.environ.update(em.env)
    try:
        yield em
    finally:
        em.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
