"""The one way pulse runs git: the `git` binary in a subprocess, bounded, with typed failures.

Commits are made as `pulse <pulse@localhost>` and unsigned, so an engine directory works on a
fresh machine without any git configuration. GIT_* variables of the caller (a hook's GIT_DIR,
say) are dropped, so every command acts on the folder it names and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from pulse_core import PulseError

GIT_TIMEOUT_S = 60.0
IDENTITY = ("-c", "user.name=pulse", "-c", "user.email=pulse@localhost",
            "-c", "commit.gpgsign=false")
_SHA = re.compile(r"[0-9a-f]{40,64}")


class GitError(PulseError):
    """A git command failed, timed out, or git is not installed."""


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    env.update(extra)
    return env


def run_git(cwd: Path, *args: str, timeout: float = GIT_TIMEOUT_S, check: bool = True,
            env: Mapping[str, str] | None = None) -> str:
    """`git args...` in `cwd`, with `env` added to a clean environment; its stdout without
    the final newline.

    Raises GitError naming the command and git's own message when it fails (unless
    `check` is false), runs past `timeout` seconds, or git cannot be started.
    """
    command = ["git", *IDENTITY, *args]
    shown = " ".join(["git", *args])
    try:
        done = subprocess.run(command, cwd=cwd, env=_environment(env or {}),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise GitError(f"`{shown}` in {cwd}: cannot run git ({exc}) — install git and make "
                       "sure it is on PATH") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"`{shown}` in {cwd} did not finish within {timeout:g} s — is another "
                       "git command holding the repository's lock?") from None
    if check and done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise GitError(f"`{shown}` in {cwd} failed (exit {done.returncode}): {message}")
    return done.stdout.rstrip("\n")


async def git(cwd: Path, *args: str, limit_s: float = GIT_TIMEOUT_S, check: bool = True,
              env: Mapping[str, str] | None = None) -> str:
    """`run_git` in a worker thread (its `timeout` is `limit_s`), so the event loop keeps
    running while git works."""
    return await asyncio.to_thread(run_git, cwd, *args, timeout=limit_s, check=check, env=env)


def head(repo: Path) -> str | None:
    """The commit that `repo`, the top of a git work tree, has checked out; None when `repo`
    is not the top of a work tree (a folder inside another repository is not) or has no
    commit yet."""
    if not repo.is_dir():
        return None
    lines = run_git(repo, "rev-parse", "--show-toplevel", "HEAD", check=False).splitlines()
    if len(lines) != 2 or not _SHA.fullmatch(lines[1]):
        return None
    return lines[1] if Path(lines[0]).resolve() == repo.resolve() else None
