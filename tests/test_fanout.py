"""A compare dispatched over Prefect workers (``cleaner compare --dispatch``), as a team would run it:

* a served stack (``cleaner serve start``: Prefect server + MLflow server; its own worker polls another pool), the
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
  0.2 s while the runs go on); the dispatching compare ingests their rows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


class Fanout:
    """A served stack, the fanout deployment and workers of its pool, in ``tmp``."""

    def __init__(self, tmp: Path, warm: Path):
        self.tmp, self.warm, self.workers = tmp, warm, {}
        self.env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        for key in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
            self.env.pop(key, None)

    def start(self) -> None:
        started = serve("start", "--detach", "--dir", str(self.tmp / "serve"), "--pool", "cleaner-stack",
                        "--prefect-port", str(free_port()), "--mlflow-port", str(free_port()), "--mlflow-store",
                        f"sqlite:///{self.tmp / 'mlflow-server.db'}", "--artifacts", str(self.tmp / "artifacts"),
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

    def start_worker(self, name: str) -> subprocess.Popen:
        """A worker in a folder of its own, with its own PREFECT_HOME: it shares only the API and the runs folder."""
        home = self.tmp / "workers" / name
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "PREFECT_HOME": str(home / "prefect-home")}
        log = open(home / "worker.log", "a")
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1",
                                 "--name", name], cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
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

    def compare(self, compare_id: str, *extra: str) -> subprocess.Popen:
        arms = json.dumps({"cleaner": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.3"],
                           "dapo": ["rollout.saar.enabled=false"]})
        overrides = [*tiny_overrides(self.tmp, self.warm, steps=2), "data.prompts_per_step=2", "rollout.n_samples=2",
                     f"compare.arms={arms}", "compare.shared=[]", "compare.seeds=[0,1]", "compare.arm_seeds={}", "compare.steps=2",
                     "compare.eval_every=2", "compare.parallel=2", "compare.lost_after_s=60", "eval.n_prompts=4",
                     "eval.samples=2", "eval.ks=[1,2]", "tracking.log_models=false",
                     f"tracking.mlflow_uri={self.mlflow}"]
        env = {**self.env, "PREFECT_HOME": str(self.tmp / f"{compare_id}-home")}
        if "--dispatch" not in extra:
            env.pop("PREFECT_API_URL")  # in-process: the compare's own temporary Prefect server
        log = open(self.tmp / f"{compare_id}.log", "w")
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "compare", "--config", "configs/tiny.yaml",
                                 "--compare-id", compare_id, *[a for o in overrides for a in ("--set", o)], *extra],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


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
def fanout(warm_model_dir, tmp_path_factory):
    f = Fanout(tmp_path_factory.mktemp("fanout"), warm_model_dir)
    f.start()
    yield f
    f.stop()


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

    def __init__(self, f: Fanout, store: Path):
        super().__init__(daemon=True)
        self.f, self.names, self.seen, self.samples = f, {str(store), f"{store}.wal"}, set(), 0
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
        for run in (f.tmp / "runs").glob(f"{compare_id}-*"):
            if (run / "steps" / "000000" / "logged.json").exists():
                return run.name
        time.sleep(0.5)
    pytest.fail(f"no run of {compare_id} logged a step within {deadline_s} s")


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
    watch = StoreWatch(f, f.tmp / "cleaner.duckdb")
    watch.start()
    request.addfinalizer(watch.stop)
    compare = f.compare("cmp-d", "--dispatch", DEPLOYMENT)
    victim = _first_logged(f, "cmp-d")
    [run] = f.flow_runs(victim)
    flow_pid = int(run["infrastructure_pid"].rsplit(":", 1)[-1])
    owner = next(name for name, proc in f.workers.items() if flow_pid in _descendants(proc.pid))
    step0 = f.tmp / "runs" / victim / "steps" / "000000"
    before = {p.name: p.stat().st_mtime_ns for p in step0.iterdir()}
    killed = f.kill_worker(owner)
    assert killed, f"{owner} had no flow process"
    assert compare.wait(timeout=1800) == 0, (f.tmp / "cmp-d.log").read_text()[-4000:]
    assert watch.stop() == set() and watch.samples > 100, "a dispatched run opened the DuckDB file"
    assert (f.tmp / "runs" / "cmp-d" / "dispatch-token.json").exists()
    log = (f.tmp / "cmp-d.log").read_text()
    assert f"{victim}: Crashed (no heartbeat for 60 s" in log and "rescheduled, retry 1 of 2" in log, log[-4000:]
    [again] = f.flow_runs(victim)
    assert again["state_type"] == "COMPLETED" and again["run_count"] >= 2
    assert {p.name: p.stat().st_mtime_ns for p in step0.iterdir() if p.name in before} == before, \
        "a finished stage of step 0 was recomputed"

    assert reference.wait(timeout=1800) == 0, (f.tmp / "cmp-i.log").read_text()[-4000:]
    store = f.tmp / "cleaner.duckdb"
    dispatched, in_process = _rows(store, "cmp-d"), _rows(store, "cmp-i")
    assert len(dispatched) == 2 * 2 * 2 * 4 and dispatched == in_process  # arms × seeds × steps × 4 trajectories
    losses = db.query(store, "SELECT regexp_replace(run_id, '^cmp-[di]-', '') AS run, step, list(value ORDER BY run_id) "
                             "AS v FROM metrics WHERE key = 'train/loss' GROUP BY ALL")
    assert losses.height == 8 and all(a == b for a, b in losses["v"].to_list())
    reports = [json.loads((f.tmp / "runs" / c / "report" / "compare.json").read_text()) for c in ("cmp-d", "cmp-i")]
    finals = [{arm: [r["final_pass_at_1"] for r in rows] for arm, rows in rep["per_seed"].items()} for rep in reports]
    assert finals[0] == finals[1]
    assert storecheck.differences(store, db.query(store, "SELECT run_id FROM runs")["run_id"].to_list()) == {}
    status = dict(db.query(store, "SELECT run_id, status FROM runs WHERE starts_with(run_id, 'cmp-d')").rows())
    assert status == {f"cmp-d-{arm}-s{seed}": "finished" for arm in ("cleaner", "dapo") for seed in (0, 1)}
