"""A compare dispatched over Prefect workers on other hosts (``cleaner compare --dispatch``), as a team would run it:

* three hosts on one machine: the dispatching compare and two workers each run in a UTS + mount namespace of
  their own (``unshare``), with a host name of their own and the shared folder (``nfs``) bind-mounted at the same
  path (``shared``), which on the machine itself is an empty folder; they share nothing else on disk but the
  project checkout (at the same path on every machine, as docs/team.md asks); the network is the machine's
  (loopback), so they reach the stack's servers on 127.0.0.1;
* a served stack (``cleaner serve start --database postgres``: Prefect server + MLflow server, both on the stack's
  PostgreSQL; its own worker polls another pool), the
  ``train-tiny-fanout`` deployment from ``prefect.yaml`` on pool ``cleaner-process``, and two workers
  (``--limit 1``) each with its own working directory and ``PREFECT_HOME``: they share only the Prefect API, the
  MLflow server and the folder of runs (``tmp``);
* 2 arms × 2 seeds, 2 steps each; once a run has logged its first step, its worker and its flow process are
  killed (a lost machine): Prefect's heartbeat automation marks it Crashed, the compare reschedules it, the other
  worker resumes it (step 0 not recomputed) and the compare completes;
* the same compare in-process (``cleaner compare`` without ``--dispatch``), run meanwhile on the same stores, gives
  the same per-run numbers: the same trajectories (token ids), rewards, losses and final pass@1; the store holds
  every row once;
* one DuckDB writer: no process a worker started ever has the DuckDB file open (sampled from ``/proc`` every
  0.2 s while the runs go on); the dispatching compare ingests their rows;
* a worker on a host whose shared path holds another folder is refused: its run fails naming the token file and
  its host, and the compare says so.

Needs root (``unshare``); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tasks.stores import db
from tests import storecheck
from tests.flowrun import tiny_overrides
from tests.test_serve import free_port
from tests.test_stack import PREFECT, serve

ROOT = Path(__file__).resolve().parents[1]
POOL, DEPLOYMENT = "cleaner-process", "train/train-tiny-fanout"
HOSTS = os.geteuid() == 0 and shutil.which("unshare") is not None
"""Whether hosts of their own can be made here (a UTS + mount namespace needs root)."""
ON_HOST = 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"'


class Fanout:
    """A served stack, the fanout deployment and workers of its pool, in ``tmp``; ``nfs`` is the shared folder, seen
    at ``shared`` by every host made with ``on_host``."""

    def __init__(self, tmp: Path, warm: Path):
        self.tmp, self.warm, self.workers = tmp, warm, {}
        self.nfs, self.shared = tmp / "nfs", tmp / "shared"
        for folder in (self.nfs, self.shared, self.folder(False)):
            folder.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        for key in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
            self.env.pop(key, None)

    def start(self) -> None:
        started = serve("start", "--detach", "--dir", str(self.tmp / "serve"), "--pool", "cleaner-stack",
                        "--prefect-port", str(free_port()), "--mlflow-port", str(free_port()), "--database",
                        "postgres", "--postgres-port", str(free_port()), "--artifacts", str(self.tmp / "artifacts"),
                        env=self.env, timeout=600)
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((self.tmp / "serve" / "pids.json").read_text())
        self.env["PREFECT_API_URL"], self.mlflow = state["prefect_api"], state["mlflow_uri"]
        for argv in ([PREFECT, "work-pool", "create", POOL, "--type", "process"],
                     [PREFECT, "--no-prompt", "deploy", "--name", DEPLOYMENT.split("/")[1]]):
            done = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr

    def stop(self) -> None:
        for name in list(self.workers):
            self.kill_worker(name)
        serve("stop", "--force", "--dir", str(self.tmp / "serve"), env=self.env, timeout=400)

    def on_host(self, host: str, argv: list[str], backing: Path | None = None) -> list[str]:
        """``argv`` on a host of its own: named ``host``, ``backing`` (default the shared folder) mounted at ``shared``."""
        return ["unshare", "--uts", "--mount", "--fork", "--kill-child", "--", "sh", "-c", ON_HOST, "sh", host,
                str(backing or self.nfs), str(self.shared), *argv]

    def start_worker(self, name: str, backing: Path | None = None) -> subprocess.Popen:
        """A worker on host ``host-<name>``, in a folder of its own with its own PREFECT_HOME: it shares only the API
        and the shared folder (``backing``: another folder at the same path, for a host that mounts the wrong one)."""
        home = self.tmp / "workers" / name
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "PREFECT_HOME": str(home / "prefect-home")}
        log = open(home / "worker.log", "a")
        argv = [PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1", "--name", name]
        proc = subprocess.Popen(self.on_host(f"host-{name}", argv, backing), cwd=home, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.workers[name] = proc
        return proc

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL a worker's process group and every flow process it started (a lost machine); returns the pids."""
        proc = self.workers.pop(name)
        flows = []
        for pid in _descendants(proc.pid):
            try:  # a short-lived child (a subprocess of the flow) may exit between the listing and the kill
                os.kill(pid, signal.SIGKILL)
                flows.append(pid)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        return flows

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, f"{self.env['PREFECT_API_URL']}{path}", timeout=30, **kw)

    def flow_runs(self, name: str) -> list[dict]:
        return self.api("POST", "/flow_runs/filter", json={"flow_runs": {"name": {"any_": [name]}}}).json()

    def folder(self, dispatched: bool) -> Path:
        """Where the files of a compare are, seen from this machine: the shared folder, or the reference's own."""
        return self.nfs if dispatched else self.tmp / "ref"

    def compare(self, compare_id: str, *extra: str) -> subprocess.Popen:
        """A compare; with ``--dispatch`` on host ``dispatcher`` with every file in the shared folder, else (the
        in-process reference) on this machine in a folder of its own."""
        dispatched = "--dispatch" in extra
        arms = json.dumps({"cleaner": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.3"],
                           "dapo": ["rollout.saar.enabled=false"]})
        work = self.shared if dispatched else self.folder(False)
        overrides = [*tiny_overrides(work, self.warm, steps=2), "data.prompts_per_step=2", "rollout.n_samples=2",
                     f"compare.arms={arms}", "compare.shared=[]", "compare.seeds=[0,1]", "compare.arm_seeds={}", "compare.steps=2",
                     "compare.eval_every=2", "compare.parallel=2", "compare.lost_after_s=60", "eval.n_prompts=4",
                     "eval.samples=2", "eval.ks=[1,2]", "tracking.log_models=false",
                     f"tracking.mlflow_uri={self.mlflow}"]
        env = {**self.env, "PREFECT_HOME": str(self.tmp / f"{compare_id}-home")}
        if not dispatched:
            env.pop("PREFECT_API_URL")  # in-process: the compare's own temporary Prefect server
        log = open(self.tmp / f"{compare_id}.log", "w")
        argv = [sys.executable, "-m", "flows.cli", "compare", "--config", "configs/tiny.yaml", "--compare-id",
                compare_id, *[a for o in overrides for a in ("--set", o)], *extra]
        return subprocess.Popen(self.on_host("dispatcher", argv) if dispatched else argv, cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _descendants(root: int) -> list[int]:
    parents, found, frontier = _parents(), [], [root]
    while frontier:
        kids = [pid for pid, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def _parents() -> dict[int, int]:
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.fixture(scope="module")
def fanout(warm_model_dir):
    if not HOSTS:
        pytest.skip("hosts of their own need root and unshare (util-linux)")
    tmp = Path(tempfile.mkdtemp(prefix="cleaner-fanout-"))
    tmp.chmod(0o755)  # the stack's PostgreSQL runs as the postgres user, which must reach its folder
    f = Fanout(tmp, warm_model_dir)
    f.start()
    yield f
    f.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def _ended(proc: subprocess.Popen) -> None:
    """A compare still running when its test failed: SIGTERM (it stops its temporary Prefect server), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class StoreWatch(threading.Thread):
    """Every 0.2 s, the pids under the workers that have ``store`` (or its WAL) open, until ``stop``."""

    def __init__(self, f: Fanout, *stores: Path):
        super().__init__(daemon=True)
        self.f, self.seen, self.samples = f, set(), 0
        self.names = {name for store in stores for name in (str(store), f"{store}.wal")}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            for proc in list(self.f.workers.values()):
                for pid in [proc.pid, *_descendants(proc.pid)]:
                    try:
                        targets = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
                    except OSError:
                        continue
                    if targets & self.names:
                        self.seen.add(pid)
            self.samples += 1

    def stop(self) -> set[int]:
        self.done.set()
        self.join(timeout=10)
        return self.seen


def _first_logged(f: Fanout, compare_id: str, deadline_s: float = 900) -> str:
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        for run in (f.nfs / "runs").glob(f"{compare_id}-*"):
            if (run / "steps" / "000000" / "logged.json").exists():
                return run.name
        time.sleep(0.5)
    pytest.fail(f"no run of {compare_id} logged a step within {deadline_s} s")


def _flow_pid(run: dict) -> int:
    return int(run["infrastructure_pid"].rsplit(":", 1)[-1])


def _hostname(pid: int) -> str:
    """The host name a process sees (its UTS namespace's), read through ``nsenter``."""
    done = subprocess.run(["nsenter", "--uts", "-t", str(pid), "hostname"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip()


def _mlflow_runs(f: Fanout) -> int:
    """Runs in the MLflow server's backend store, read from the stack's PostgreSQL database ``mlflow``."""
    import psycopg2

    from flows.serve_db import Postgres

    state = json.loads((f.tmp / "serve" / "pids.json").read_text())
    pg = Postgres(f.tmp / "serve" / "postgres", int(state["postgres_port"]))
    with psycopg2.connect(pg.base_url() + "/mlflow") as con, con.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        return cur.fetchone()[0]


def _rows(store: Path, compare_id: str) -> dict[tuple, tuple]:
    """(arm-seed, step, traj id) → (response ids, reward) of the runs of one compare."""
    df = db.query(store, "SELECT run_id, step, traj_id, response_ids, reward FROM trajectories "
                         "WHERE starts_with(run_id, ?)", [f"{compare_id}-"])
    return {(r[0].removeprefix(f"{compare_id}-"), r[1], r[2]): (tuple(r[3]), r[4]) for r in df.rows()}


def test_lost_after_must_cover_two_heartbeats():
    from flows.config import ConfigError, load_config

    assert load_config("configs/tiny.yaml", ["compare.lost_after_s=60"]).compare.lost_after_s == 60
    with pytest.raises(ConfigError, match="lost_after_s 59 is under twice heartbeat_s \\(30\\)"):
        load_config("configs/tiny.yaml", ["compare.lost_after_s=59"])


def test_the_idempotency_key_changes_with_the_parameters():
    from flows.dispatch import Job, idempotency_key

    a, b = Job("r", {"overrides": ["seed=0"]}), Job("r", {"overrides": ["seed=1"]})
    assert idempotency_key(a) == idempotency_key(Job("r", {"overrides": ["seed=0"]})) != idempotency_key(b)
    assert idempotency_key(a).startswith("r-")


def test_dispatch_to_a_missing_deployment_names_it_and_the_api(prefect_harness):
    from flows.dispatch import DispatchError, check_deployment

    with pytest.raises(DispatchError, match="compare.dispatch: no deployment 'train/nowhere' on the Prefect API http"):
        check_deployment("train/nowhere")


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_dispatched_compare_survives_a_lost_worker_and_matches_in_process(fanout, request):
    f = fanout
    # the in-process compare (the reference) runs meanwhile, through the wait for the lost worker's heartbeat
    reference = f.compare("cmp-i")
    request.addfinalizer(lambda: _ended(reference))
    for name in ("w1", "w2"):
        f.start_worker(name)
    watch = StoreWatch(f, f.nfs / "cleaner.duckdb", f.shared / "cleaner.duckdb")
    watch.start()
    request.addfinalizer(watch.stop)
    compare = f.compare("cmp-d", "--dispatch", DEPLOYMENT)
    request.addfinalizer(lambda: _ended(compare))
    victim = _first_logged(f, "cmp-d")
    [run] = f.flow_runs(victim)
    assert _hostname(_flow_pid(run)) in ("host-w1", "host-w2")
    flow_pid = _flow_pid(run)
    owner = next(name for name, proc in f.workers.items() if flow_pid in _descendants(proc.pid))
    step0 = f.nfs / "runs" / victim / "steps" / "000000"
    before = {p.name: p.stat().st_mtime_ns for p in step0.iterdir()}
    killed = f.kill_worker(owner)
    assert killed, f"{owner} had no flow process"
    assert compare.wait(timeout=1800) == 0, (f.tmp / "cmp-d.log").read_text()[-4000:]
    assert watch.stop() == set() and watch.samples > 100, "a dispatched run opened the DuckDB file"
    assert not list(f.shared.iterdir()), "the shared folder leaked out of the hosts' mount namespaces"
    assert json.loads((f.nfs / "runs" / "cmp-d" / "dispatch-token.json").read_text())["host"] == "dispatcher"
    log = (f.tmp / "cmp-d.log").read_text()
    assert f"{victim}: Crashed (no heartbeat for 60 s" in log and "rescheduled, retry 1 of 2" in log, log[-4000:]
    [again] = f.flow_runs(victim)
    assert again["state_type"] == "COMPLETED" and again["run_count"] >= 2
    assert {p.name: p.stat().st_mtime_ns for p in step0.iterdir() if p.name in before} == before, \
        "a finished stage of step 0 was recomputed"

    assert reference.wait(timeout=1800) == 0, (f.tmp / "cmp-i.log").read_text()[-4000:]
    stores = {c: f.folder(c == "cmp-d") / "cleaner.duckdb" for c in ("cmp-d", "cmp-i")}
    dispatched, in_process = _rows(stores["cmp-d"], "cmp-d"), _rows(stores["cmp-i"], "cmp-i")
    assert len(dispatched) == 2 * 2 * 2 * 4 and dispatched == in_process  # arms × seeds × steps × 4 trajectories
    losses = [dict(((r, step), v) for r, step, v in db.query(
        store, "SELECT regexp_replace(run_id, '^cmp-[di]-', '') AS run, step, value FROM metrics "
               "WHERE key = 'train/loss'").rows()) for store in stores.values()]
    assert len(losses[0]) == 8 and losses[0] == losses[1]
    reports = [json.loads((f.folder(c == "cmp-d") / "runs" / c / "report" / "compare.json").read_text())
               for c in ("cmp-d", "cmp-i")]
    finals = [{arm: [r["final_pass_at_1"] for r in rows] for arm, rows in rep["per_seed"].items()} for rep in reports]
    assert finals[0] == finals[1]
    for store in stores.values():
        assert storecheck.differences(store, db.query(store, "SELECT run_id FROM runs")["run_id"].to_list()) == {}
    assert _mlflow_runs(f) >= 2 * (2 * 2 + 1), "the MLflow server's runs are not in its PostgreSQL store"
    status = dict(db.query(stores["cmp-d"], "SELECT run_id, status FROM runs WHERE starts_with(run_id, 'cmp-d')").rows())
    assert status == {f"cmp-d-{arm}-s{seed}": "finished" for arm in ("cleaner", "dapo") for seed in (0, 1)}


def test_a_worker_that_mounts_another_folder_is_refused_naming_the_path_and_its_host(fanout, request):
    """The only worker left mounts a folder of its own at the shared path (a copy of the data, not the store): its
    run stops before training with the token error, and the compare (no retries) names the run, path and host."""
    f = fanout
    for name in list(f.workers):
        f.kill_worker(name)
    elsewhere = f.tmp / "elsewhere"
    elsewhere.mkdir()
    f.start_worker("wx", backing=elsewhere)
    compare = f.compare("cmp-x", "--dispatch", DEPLOYMENT, "--set", "compare.seeds=[0]", "--set", "compare.retries=0",
                        "--set", "compare.shared_initial_eval=false")
    request.addfinalizer(lambda: _ended(compare))
    assert compare.wait(timeout=900) != 0
    log = (f.tmp / "cmp-x.log").read_text()
    token = f.shared / "runs" / "cmp-x" / "dispatch-token.json"
    assert f"dispatched run cmp-x-dapo-s0 on host host-wx: {token} is missing: this worker does not see the " \
           "dispatcher's store" in log, log[-4000:]
    assert "2 of 2 dispatched runs did not complete" in log
    for run in ("cmp-x-cleaner-s0", "cmp-x-dapo-s0"):
        assert not (f.nfs / "runs" / run).exists() and not (elsewhere / "runs" / run).exists()
