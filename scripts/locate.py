"""Where the scripts find cairn, and how they quote a server that did not start.

$CAIRN_BIN picks the binary; otherwise release/cairn in cargo's target directory, as cargo
resolves it ($CARGO_TARGET_DIR, build.target-dir), or target/ where cargo cannot be asked."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def target_dir():
    try:
        out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)["target_directory"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return os.path.join(ROOT, "target")


def cairn_bin():
    return os.environ.get("CAIRN_BIN") or os.path.join(target_dir(), "release", "cairn")


def require(binary, who):
    """Stops the run at once, before any measuring, when the binary is not there."""
    if not os.access(binary, os.X_OK):
        sys.exit(f"{who}: cairn did not start: no such file {binary} (cargo build --release -p cairn, or set CAIRN_BIN)")


def tail(path, size=3000):
    """The end of a server's log, to quote when it exited during start."""
    with open(path, errors="replace") as f:
        return f.read()[-size:]
