"""The repository's benchmark harness: models, data sets and scripts, run from the repository root
as ``python -m benchmarks.<name>``.

Not part of the installed package (``setup.py`` installs ``mindspore_ngd`` only): the library does
not carry its benchmarks, their data loaders or the quick-start demo. Their extra dependencies are
the ``examples`` and ``bench`` extras.
"""
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULT = "RESULT "


def save_results(out_dir, name, payload):
    """Write ``payload`` plus a description of the machine to ``out_dir/name.json``; return the path."""
    import mindspore as ms
    payload = dict(payload)
    payload["machine"] = {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "mindspore": ms.__version__,
                          "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA")}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
    print(f"saved {path}")
    return path


def positive_ints(text):
    """The comma-separated integers of a command-line option's value, or ``[]`` when any of them is not
    an integer >= 1 (the caller names the option and what it needs)."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        return []
    return values if values and min(values) >= 1 else []


def parse_names(parser, option, text, allowed, all_value=None):
    """The comma-separated names of a command-line option, each among ``allowed`` and none repeated
    (``all`` gives ``all_value`` when that is set); ``parser.error`` names the option otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if all_value is not None and names == ["all"]:
        return list(all_value)
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        parser.error(f"{option}: unknown {', '.join(map(repr, bad)) or 'empty value'}; allowed: "
                     f"{', '.join(allowed)}" + (" or all" if all_value is not None else ""))
    if len(set(names)) != len(names):
        parser.error(f"{option}: names must not repeat, got {text!r}")
    return names


def print_result(result):
    """A child process's result, as the one line :func:`run_child` reads."""
    print(_RESULT + json.dumps(result), flush=True)


def run_child(module, args, env=None):
    """Run ``python -m module args...`` from the repository root; (the dict its :func:`print_result`
    line holds, or None; the finished process)."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            return json.loads(line[len(_RESULT):]), proc
    return None, proc


def child_error(proc):
    """Why a child process printed no result: its exit code and last lines of output."""
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return f"exit code {proc.returncode}: {' / '.join(tail)}"
