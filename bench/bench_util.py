"""Pieces the benchmark scripts share: running a program that writes a JSON
summary, and writing results as JSON."""

import json
import os
import subprocess


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


def write_text(path, text):
    """Writes text to path, creating the folder if needed; atomically (a
    temporary name, fsynced, renamed), so a killed benchmark or plot never
    leaves half a file behind."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path, obj):
    """Writes obj as indented JSON (write_text's way)."""
    write_text(path, json.dumps(obj, indent=2) + "\n")
