"""Pieces the benchmark scripts share: running a program that writes a JSON
summary, writing results as JSON, and giving PyTorch the OpenBLAS kernel set
the engine used."""

import json
import os
import subprocess
import sys
import tempfile

# OpenBLAS reads this when the library loads and then runs that kernel set
# ("Haswell", "SkylakeX", "Cooperlake", ...; case does not matter; a name it
# does not know is ignored without a word). The engine (dpt) re-executes
# itself with it set when OpenBLAS picked kernels without AVX-512 on an AVX-512
# CPU, and reports the kernel set it ran as "blas_core" in its summary. Debian's
# PyTorch does its Linear GEMMs in the same OpenBLAS, so a fair comparison
# gives it the same kernel set.
BLAS_CORE_VAR = "OPENBLAS_CORETYPE"


class RunError(Exception):
    """A benchmark process failed; the message says which and why."""


def run_and_load(name, cmd, summary_path, env=None, timeout=None):
    """Runs cmd, then returns the JSON it wrote to summary_path.

    On failure (cannot start, non-zero exit, timeout, no JSON) raises
    RunError carrying the command and its stderr."""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        raise RunError(f"{name}: cannot run {cmd[0]}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise RunError(f"{name}: timed out after {timeout} s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        raise RunError(f"{name} failed with exit status {proc.returncode}: {' '.join(cmd)}\n"
                       f"--- stderr ---\n{proc.stderr.rstrip()}")
    try:
        with open(summary_path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"{name}: no valid JSON summary at {summary_path}: {e}\n"
                       f"--- stderr ---\n{proc.stderr.rstrip()}") from e


def write_json(path, obj):
    """Writes obj as indented JSON, creating the folder if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def add_torch_blas_core_option(ap):
    """Adds --torch-blas-core same|default|NAME to an ArgumentParser."""
    ap.add_argument("--torch-blas-core", default="same", metavar="same|default|NAME",
                    help=f"OpenBLAS kernel set for the PyTorch runs: 'same' (default) sets "
                    f"{BLAS_CORE_VAR} to the engine's (its summary's blas_core; a value already "
                    f"in the environment is kept for both); 'default' removes the variable, so "
                    f"OpenBLAS picks for PyTorch by itself (PyTorch out of the box); NAME "
                    f"(e.g. Haswell, SkylakeX, Cooperlake) sets it to NAME")


def torch_blas_core(choice, engine_core, environ=None):
    """The OPENBLAS_CORETYPE value for the PyTorch runs, and where it came from.

    Returns (value, source); value None means the variable is removed from
    PyTorch's environment. choice is --torch-blas-core:
      'same'     the user's OPENBLAS_CORETYPE when set (the engine inherited it
                 too): source 'user'; else engine_core: source 'engine'; if the
                 engine's core is unknown, None: source 'engine unknown'.
      'default'  None: source 'default'.
      NAME       NAME: source 'option'."""
    environ = os.environ if environ is None else environ
    if choice == "default":
        return None, "default"
    if choice != "same":
        return choice, "option"
    if environ.get(BLAS_CORE_VAR):
        return environ[BLAS_CORE_VAR], "user"
    if engine_core:
        return engine_core, "engine"
    return None, "engine unknown"


def with_blas_core(env, value):
    """A copy of env (os.environ when None) with OPENBLAS_CORETYPE set to
    value, or removed when value is None."""
    env = dict(os.environ if env is None else env)
    if value is None:
        env.pop(BLAS_CORE_VAR, None)
    else:
        env[BLAS_CORE_VAR] = value
    return env


def blas_core_record(choice, engine_core, value, source):
    """The "blas_core" entry of a results file: the engine's kernel set (its
    summary's blas_core), PyTorch's (the OPENBLAS_CORETYPE it got, or
    "default": OpenBLAS picked by itself), the option and where the value
    came from, and the user's OPENBLAS_CORETYPE (None: unset)."""
    return {"engine": engine_core, "torch": value or "default", "torch_option": choice,
            "torch_source": source, "user_env": os.environ.get(BLAS_CORE_VAR)}


def blas_core_line(rec, engine="engine", torch="PyTorch"):
    """One line for a table header: which OpenBLAS kernel set each side ran."""
    why = {"user": f"{BLAS_CORE_VAR} from the environment",
           "engine": f"same as {engine}", "default": "OpenBLAS's own pick, not set",
           "option": f"--torch-blas-core {rec['torch_option']}",
           "engine unknown": "not set: the engine's core is unknown"}[rec["torch_source"]]
    line = f"OpenBLAS kernels: {engine} {rec['engine'] or 'unknown'}, {torch} {rec['torch']} ({why})"
    if rec["torch"] != "default" and rec["engine"] and rec["torch"].lower() != rec["engine"].lower():
        line += f"\n  note: {engine} and {torch} ran different kernel sets; the ratios compare them too"
    elif rec["torch"] == "default":
        line += f"\n  note: {torch}'s kernel set was not set; it may differ from {engine}'s"
    return line


def probe_blas_core(dpt, timeout=120):
    """The kernel set the engine runs, from a 2-step W-MLP run with a batch
    of 8 (well under a second); None when it fails or does not say."""
    with tempfile.TemporaryDirectory(prefix="dpt_blas_probe_") as tmp:
        path = os.path.join(tmp, "probe.json")
        cmd = [dpt, "train", "--model", "mlp", "--steps", "2", "--batch", "8", "--synthetic",
               "--quiet", "--threads", "1", "--summary-out", path]
        try:
            return run_and_load("blas core probe", cmd, path, timeout=timeout).get("blas_core")
        except RunError as e:
            print(f"warning: {e}", file=sys.stderr)
            return None
