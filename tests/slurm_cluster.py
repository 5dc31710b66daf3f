"""A throwaway one-node SLURM cluster on this host, for the `slurm` tests and for trying a study.

    .venv/bin/python tests/slurm_cluster.py start [DIR]   # prints `export SLURM_CONF=...`
    .venv/bin/python tests/slurm_cluster.py stop  [DIR]   # cancels its jobs, stops it, removes DIR

It needs Debian's ``slurm-wlm`` and ``munge`` packages (22.05; ``apt-get install -y slurm-wlm
munge``) and root: slurmd starts jobs as their user. Everything it writes (munge key and socket,
slurm.conf, state, spool, logs) lives under one temp dir, its ports are free ones picked at start,
and its daemons run in the foreground of their own process group: nothing outside the dir
changes, and two clusters do not see each other. Clients find it through ``SLURM_CONF``.

``shared_cluster`` lets several pytest-xdist workers use one cluster: the first starts it, the
last to leave stops it (a lock file and a user count beside it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = "slurm-wlm munge"
DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "node0"
PARTITION = "debug"
KILL_WAIT_S = 10  # SIGTERM to SIGKILL on scancel or a time limit (Slurm's default is 30)


def missing() -> str | None:
    """Why no cluster can start here (one line), or None."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"no SLURM here ({', '.join(absent)} not installed): as root, apt-get install -y {PACKAGES}"
    if os.geteuid() != 0:
        return "the one-node SLURM test cluster needs root (slurmd starts jobs as their user)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024  # leave the OS a GiB
    return 4096


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int) -> str:
    host = socket.gethostname()
    return f"""\
# one-node test cluster (tests/slurm_cluster.py); everything under {root}
ClusterName=attnlab-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it starts again (default 120 s)
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# schedule every few seconds, not every 30-60: a requeued job starts once its begin time passes
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# trust the node line below instead of draining the node when slurmd counts the hardware differently
# (a container's cpuset, sockets x cores x threads)
SlurmdParameters=config_overrides
KillWait={KILL_WAIT_S}
SlurmctldTimeout=30
SlurmdTimeout=60
MinJobAge=600
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """slurmctld + slurmd + munged under ``root``; ``env`` is what a client needs."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.state_file = self.root / "cluster.json"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, env={**os.environ, **self.env}, capture_output=True, text=True, check=check, timeout=timeout
        )

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(slurm_conf(self.root, ctld_port, slurmd_port))
        m = self.root / "munge"
        commands = {
            "munged": [
                _binary("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={m}/munge.socket",
                f"--pid-file={m}/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
            "slurmctld": [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)],
            "slurmd": [_binary("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)],
        }
        pids = {}
        try:
            for name, cmd in commands.items():
                log = open(self.root / "log" / f"{name}.out", "w")
                proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True
                )
                pids[name] = proc.pid
                self.state_file.write_text(json.dumps(pids))
                if name == "munged":
                    self._wait(lambda: (m / "munge.socket").exists(), timeout_s, "munged to open its socket")
            self._wait(self._node_ready, timeout_s, f"node {NODE} to come up")
        except BaseException:
            self.stop(remove=False)
            raise
        return self

    def _node_ready(self) -> bool:
        state = self.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).stdout.strip()
        return state.startswith(("idle", "mix", "alloc"))

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.time() + timeout_s
        while not ready():
            if time.time() > deadline:
                logs = "".join(
                    f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((self.root / "log").glob("*"))
                )
                raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}{logs}")
            time.sleep(0.2)

    def jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i", check=False).stdout
        return out.split()

    def stop(self, remove: bool = True) -> None:
        """Cancel every job (and wait for their processes to end), stop the daemons, remove the dir."""
        if not self.state_file.exists():
            return
        pids = json.loads(self.state_file.read_text())
        if "slurmctld" in pids:
            self.run("scancel", "--full", "-u", str(os.getuid()), check=False)
            deadline = time.time() + KILL_WAIT_S + 20
            while time.time() < deadline and self._alive(pids.get("slurmd")) and self.jobs():
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            pid = pids.get(name)
            if pid and self._alive(pid):
                os.killpg(pid, signal.SIGTERM)
                deadline = time.time() + 15
                while self._alive(pid) and time.time() < deadline:
                    time.sleep(0.1)
                if self._alive(pid):
                    os.killpg(pid, signal.SIGKILL)
        self.state_file.unlink()
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _alive(pid: int | None) -> bool:
        if not pid:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
        except OSError:
            return False


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def shared_cluster(root: Path):
    """One cluster for every process that enters with the same ``root``; the last one out stops it."""
    root.mkdir(parents=True, exist_ok=True)
    cluster, users = SlurmCluster(root / "cluster"), root / "users"
    with _locked(root / "lock"):
        count = int(users.read_text() or 0) if users.exists() else 0
        if count == 0:
            cluster.start()
        users.write_text(str(count + 1))
    try:
        yield cluster
    finally:
        with _locked(root / "lock"):
            count = int(users.read_text()) - 1
            users.write_text(str(count))
            if count == 0:
                cluster.stop()
                users.unlink()
    if not users.exists():  # the last one out: nothing of the cluster is left
        (root / "lock").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            root.rmdir()


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("start", "stop"):
        print("usage: slurm_cluster.py start|stop [DIR]", file=sys.stderr)
        return 2
    if argv[0] == "start":
        why = missing()
        if why:
            print(f"slurm_cluster: {why}", file=sys.stderr)
            return 1
        root = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="attnlab-slurm-"))
        cluster = SlurmCluster(root).start()
        print(f"export SLURM_CONF={cluster.conf}   # stop: {sys.argv[0]} stop {root}")
        return 0
    if len(argv) < 2:
        print("usage: slurm_cluster.py stop DIR", file=sys.stderr)
        return 2
    SlurmCluster(Path(argv[1])).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
