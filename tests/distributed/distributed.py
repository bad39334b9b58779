"""Launch a script under ``msrun`` from a test and collect what every rank reported.

Driver side (pytest)::

    from distributed import run_msrun
    run = run_msrun("tests/distributed/workers/equivalence.py", ["--steps", "3"], workers=2, timeout=240)
    assert run.results[0]["loss"] == run.results[1]["loss"]

Worker side (the launched script; the repository root, ``tests/`` and ``tests/distributed/`` are on
its ``PYTHONPATH``)::

    from distributed import run_worker, write_result

    def main():
        ...  # init(), train, ...
        write_result({"loss": float(loss)})        # -> $NGD_MSRUN_OUT/rank<RANK_ID>.json

    if __name__ == "__main__":
        run_worker(main)                           # an exception -> os._exit(1): msrun stops at once

The launch is ``msrun --worker_num=W --local_worker_num=W --master_port=<free port>
--log_dir=<tmp>/logs --join=True script args...`` with ``ONEDNN_MAX_CPU_ISA=AVX2`` unless the caller's
environment sets it. ``run_msrun`` holds an exclusive file lock while msrun runs (one multi-process
job at a time on a small machine), kills the whole process group on timeout, and raises
:class:`MsrunError` with the tail of every worker log when msrun fails, times out, or a rank wrote
no result. Nothing here imports MindSpore.
"""
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))          # tests/distributed: this module, dist_cases.py
TESTS_DIR = os.path.dirname(HERE)                           # tests: nets.py, training.py, reference/
REPO_ROOT = os.path.dirname(TESTS_DIR)
OUT_ENV = "NGD_MSRUN_OUT"
LOCK_PATH = os.path.join(tempfile.gettempdir(), "mindspore_ngd_msrun.lock")
_NOISE = re.compile(r"^\[(INFO|WARNING)\] (DISTRIBUTED|DEVICE|ME|PS|RUNTIME_FRAMEWORK|GE|PRE_ACT)\(")


class MsrunError(RuntimeError):
    """msrun failed, timed out, or a rank produced no result; the message carries the worker logs."""


@dataclass
class MsrunRun:
    """What one msrun launch produced."""
    returncode: int
    elapsed: float                      # seconds, msrun start to exit
    workdir: str                        # holds logs/ and out/ (kept when keep=True or on failure)
    output: str                         # msrun's own stdout+stderr
    logs: dict = field(default_factory=dict)       # rank -> worker log text
    results: dict = field(default_factory=dict)    # rank -> JSON object written by write_result

    def log_tail(self, rank, lines=60, filter_noise=True):
        return _tail(self.logs.get(rank, ""), lines, filter_noise)


def free_port():
    """A TCP port that was free a moment ago (msrun's scheduler binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(text, lines, filter_noise=True):
    rows = text.splitlines()
    if filter_noise:
        rows = [r for r in rows if not _NOISE.match(r)]
    return "\n".join(rows[-lines:])


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def run_msrun(script, args=(), workers=2, timeout=300, env=None, keep=False, lines=60, error_grace=5.0):
    """Run ``script`` under msrun with ``workers`` local workers; return a :class:`MsrunRun`.

    Args:
        script: path of the worker script (relative paths are taken from the repository root).
        args: extra command-line arguments for the script.
        workers: number of ranks (all on this machine).
        timeout: seconds before the whole job (msrun, scheduler, workers) is killed.
        env: extra environment variables for the job.
        keep: keep the temporary directory (logs, results) after success; it is always kept on failure.
        lines: lines of each worker log quoted in an error message.
        error_grace: seconds to let msrun wind down after a rank reported an error (through
            :func:`run_worker`) before the job is killed.

    Raises:
        MsrunError: non-zero exit, timeout, or a rank that wrote no result; the message shows the
            command, msrun's output and the tail of every worker log (MindSpore's INFO/WARNING
            chatter removed), and where the full logs are.
    """
    script = script if os.path.isabs(script) else os.path.join(REPO_ROOT, script)
    if not os.path.exists(script):
        raise FileNotFoundError(f"msrun script not found: {script}")
    if shutil.which("msrun") is None:
        raise MsrunError("msrun is not on PATH (it comes with the mindspore wheel)")
    workdir = tempfile.mkdtemp(prefix="ngd_msrun_")
    log_dir, out_dir = os.path.join(workdir, "logs"), os.path.join(workdir, "out")
    os.makedirs(out_dir)
    job_env = dict(os.environ)
    job_env.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    job_env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, HERE, TESTS_DIR]
                                            + [p for p in [os.environ.get("PYTHONPATH")] if p])
    job_env[OUT_ENV] = out_dir
    job_env.update(env or {})
    job_env["PYTHONUNBUFFERED"] = "1"
    command = ["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}",
               f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True",
               script] + [str(a) for a in args]
    output_path = os.path.join(workdir, "msrun.out")
    timed_out = stopped_early = False
    with open(LOCK_PATH, "w") as lock, open(output_path, "w") as output_file:
        fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.time()
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=job_env, stdout=output_file,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        first_error = None
        while proc.poll() is None:
            now = time.time()
            if now - start > timeout:
                timed_out = True
            elif first_error is None and _any_error(out_dir):
                first_error = now
            elif first_error is not None and now - first_error > error_grace:
                # msrun kills the other workers when one exits non-zero, but then waits for its
                # scheduler, which only notices the dead node after a heartbeat timeout (~30 s) or
                # never (a rank that died before init()); stop the whole job instead
                stopped_early = True
            if timed_out or stopped_early:
                _kill_group(proc)
                break
            time.sleep(0.2)
        proc.wait()
        elapsed = time.time() - start
    run = MsrunRun(returncode=proc.returncode, elapsed=elapsed, workdir=workdir, output=_read(output_path))
    for rank in range(workers):
        run.logs[rank] = _read(os.path.join(log_dir, f"worker_{rank}.log"))
        path = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                run.results[rank] = json.load(handle)
    missing = [r for r in range(workers) if r not in run.results]
    errors = {r: v["error"] for r, v in run.results.items() if isinstance(v, dict) and "error" in v}
    if timed_out or proc.returncode != 0 or missing or errors:
        reason = (f"timed out after {timeout} s" if timed_out else
                  f"rank(s) {sorted(errors)} reported an error; job stopped {error_grace} s later"
                  if stopped_early else
                  f"exit code {proc.returncode}" if proc.returncode != 0 else
                  f"rank(s) {sorted(errors)} reported an error" if errors else
                  f"no result from rank(s) {missing} (did the script call write_result?)")
        parts = [f"msrun job failed: {reason} ({elapsed:.1f} s)", "command: " + " ".join(command),
                 f"full logs: {log_dir}", "--- msrun output (tail) ---", _tail(run.output, 20)]
        for rank in range(workers):
            if rank in errors:
                parts += [f"--- rank {rank} error ---", errors[rank].rstrip()]
            tail = run.log_tail(rank, lines) or run.log_tail(rank, 5, filter_noise=False)
            parts += [f"--- worker_{rank}.log (tail, INFO/WARNING removed) ---", tail]
        scheduler = _read(os.path.join(log_dir, "scheduler.log"))
        if scheduler and proc.returncode != 0:
            parts += ["--- scheduler.log (tail) ---", _tail(scheduler, 10)]
        raise MsrunError("\n".join(parts))
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return run


def _any_error(out_dir):
    for name in os.listdir(out_dir):
        if name.endswith(".json"):
            try:
                with open(os.path.join(out_dir, name), encoding="utf-8") as handle:
                    value = json.load(handle)
                    if isinstance(value, dict) and "error" in value:
                        return True
            except (OSError, ValueError, TypeError):
                continue
    return False


def _kill_group(proc):
    """SIGTERM, then SIGKILL, the process group msrun leads (its scheduler and workers)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# --------------------------------------------------------------------------- worker side
def worker_rank():
    """This worker's rank from msrun's environment (``RANK_ID``), before or without ``init()``."""
    return int(os.environ.get("RANK_ID", "0"))


def init_data_parallel():
    """Worker side: CPU graph mode, ``mindspore.communication.init()`` and ``DATA_PARALLEL`` with
    averaged gradients, as the distributed optimizers expect. Returns ``(rank, world size)``."""
    import mindspore as ms
    from mindspore.communication import init, get_rank, get_group_size
    from mindspore.context import ParallelMode
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def write_result(obj, rank=None):
    """Write ``obj`` (JSON-serialisable; NumPy arrays/scalars converted) for the driver to collect."""
    out_dir = os.environ.get(OUT_ENV)
    if not out_dir:
        raise RuntimeError(f"{OUT_ENV} is not set: run this script through tests/distributed/distributed.py:run_msrun")
    rank = worker_rank() if rank is None else rank
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(obj, handle, default=_jsonable)
    os.replace(path + ".tmp", path)
    return path


def run_worker(main, *args, **kwargs):
    """Call ``main(*args, **kwargs)`` in a worker; on any exception print the traceback, record it as
    this rank's result (``{"error": ...}``) and leave with ``os._exit(1)``.

    A worker that lets an exception propagate after ``init()`` keeps running MindSpore's exit
    handlers until the scheduler's heartbeat times it out (~30 s on MCCL); ``os._exit`` makes msrun
    see the failure at once and kill the other ranks.
    """
    try:
        return main(*args, **kwargs)
    except BaseException:       # noqa: B036 - report everything, including SystemExit from argparse
        import traceback
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        try:
            write_result({"error": text})
        except Exception:       # noqa: BLE001 - the exit below matters more
            pass
        sys.stdout.flush()
        os._exit(1)


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "asnumpy"):
        return value.asnumpy().tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


if __name__ == "__main__":        # python tests/distributed/distributed.py script.py [args...]
    result = run_msrun(sys.argv[1], sys.argv[2:], keep=True)
    print(json.dumps({"elapsed": round(result.elapsed, 1), "workdir": result.workdir, "results": result.results},
                     indent=1))
