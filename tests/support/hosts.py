"""A second host on this machine, for tests of what crosses a network: a network
namespace (and a UTS namespace, for a hostname of its own) joined to this one by a veth
pair on a /30 of its own, cut off and healed at will; and a Postgres cluster of one's
own (`initdb`) that listens where the test says. Needs root (CI runs as root), `ip`, `tc`,
`unshare` and PostgreSQL's server binaries.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.support.redis_server import free_port


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stdout}{done.stderr}")


def as_postgres(argv: list[str]) -> list[str]:
    """`initdb` and `pg_ctl` refuse to run as root: as root, run them as `postgres`."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class Network:
    """The namespace of host A and the veth pair that joins it to this host."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = f"ajlab-{tag}"
        self.here_if, self.there_if = f"ajh{tag}", f"aja{tag}"
        taken = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        while True:  # a /30 of 10.231.0.0/16 no interface of this machine uses
            base = f"10.231.{random.randrange(256)}.{4 * random.randrange(64)}"
            prefix = base.rsplit(".", 1)[0] + "."
            last = int(base.rsplit(".", 1)[1])
            self.here, self.there = f"{prefix}{last + 1}", f"{prefix}{last + 2}"
            if self.here not in taken and self.there not in taken:
                break
        self.cut_how: str | None = None

    def up(self) -> Network:
        if os.geteuid() != 0:
            raise RuntimeError("the partition lab needs root (ip netns, tc)")
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.here_if, "type", "veth", "peer", "name", self.there_if)
        _run("ip", "link", "set", self.there_if, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.here}/30", "dev", self.here_if)
        _run("ip", "link", "set", self.here_if, "up")
        self._in_a("ip", "addr", "add", f"{self.there}/30", "dev", self.there_if)
        self._in_a("ip", "link", "set", self.there_if, "up")
        self._in_a("ip", "link", "set", "lo", "up")
        return self

    def down(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=60)
        subprocess.run(["ip", "link", "del", self.here_if], capture_output=True, timeout=60)

    def _in_a(self, *argv: str) -> None:
        _run("ip", "netns", "exec", self.ns, *argv)

    def in_a(self, argv: list[str], hostname: str) -> list[str]:
        """`argv` as run on host A: in its network namespace, with its own hostname."""
        return [
            *("ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c"),
            'hostname "$0" && exec "$@"',
            hostname,
            *argv,
        ]

    def cut(self, how: str) -> None:
        """Cut host A off: `link` (its end of the pair down) or `drop` (every frame
        dropped, both ways, with the links up)."""
        if how == "link":
            self._in_a("ip", "link", "set", self.there_if, "down")
        else:
            _run("tc", "qdisc", "add", "dev", self.here_if, "root", "pfifo", "limit", "0")
            self._in_a("tc", "qdisc", "add", "dev", self.there_if, "root", "pfifo", "limit", "0")
        self.cut_how = how

    def heal(self) -> None:
        if self.cut_how == "link":
            self._in_a("ip", "link", "set", self.there_if, "up")
        elif self.cut_how == "drop":
            _run("tc", "qdisc", "del", "dev", self.here_if, "root")
            self._in_a("tc", "qdisc", "del", "dev", self.there_if, "root")
        self.cut_how = None


class Postgres:
    """A Postgres cluster of the lab's own, trusting this host and host A."""

    def __init__(self, listen: list[str], trusted: str) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("the lab needs PostgreSQL's initdb (/usr/lib/postgresql/*)")
        self.bin = Path(found[-1]).parent
        self.home = Path(tempfile.mkdtemp(prefix="agent-jobs-lab-pg-"))
        self.home.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        self.port = free_port()
        self.listen, self.trusted = listen, trusted
        self.data = self.home / "data"

    def url(self, host: str) -> str:
        return f"postgresql+psycopg://postgres@{host}:{self.port}/postgres"

    def _do(self, argv: list[str]) -> None:
        done = subprocess.run(as_postgres(argv), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]}: {done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        self._do([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"])
        hba = self.data / "pg_hba.conf"
        rule = f"host all all {self.trusted} trust\n"
        self._do(["sh", "-c", f"printf '%s' '{rule}' >> {hba}"])
        options = f"-p {self.port} -k {self.home} -c listen_addresses={','.join(self.listen)}"
        ctl = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.home / "log")]
        self._do([*ctl, "-o", options, "-w", "start"])
        return self

    def stop(self) -> None:
        subprocess.run(
            as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
            ),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.home, ignore_errors=True)
