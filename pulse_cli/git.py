"""The one way pulse runs git: the `git` binary in a subprocess, bounded, with typed failures.

Commits are made as `pulse <pulse@localhost>` and unsigned, so an engine directory works on a
fresh machine without any git configuration. GIT_* variables of the caller (a hook's GIT_DIR,
say) are dropped, so every command acts on the folder it names and nothing else; optional
locks are off, so a command that only reads (status, diff, ls-files) never rewrites an index.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from pulse_core import PulseError

GIT_TIMEOUT_S = 60.0
IDENTITY = ("-c", "user.name=pulse", "-c", "user.email=pulse@localhost",
            "-c", "commit.gpgsign=false")
_SHA = re.compile(r"[0-9a-f]{40,64}")


class GitError(PulseError):
    """A git command failed, timed out, or git is not installed.

    `said` is one line for a report: git's first `error:` or `fatal:` line (else its first
    line), or, when git did not answer, the message itself."""

    def __init__(self, message: str, said: str | None = None) -> None:
        super().__init__(message)
        self.said = said or message


def first_complaint(output: str) -> str:
    """git's first `error:` or `fatal:` line in `output`; else its first non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith(("error:", "fatal:"))),
                lines[0] if lines else "")


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    env.update(extra)
    return env


def run_git_bytes(cwd: Path, *args: str, timeout: float = GIT_TIMEOUT_S, check: bool = True,
                  env: Mapping[str, str] | None = None, stdin: bytes = b"") -> bytes:
    """`git args...` in `cwd`, with `env` added to a clean environment and `stdin` as its
    input; its stdout as bytes.

    Raises GitError naming the command and git's own message when it fails (unless
    `check` is false), runs past `timeout` seconds, or git cannot be started.
    """
    command = ["git", *IDENTITY, *args]
    shown = " ".join(["git", *args])
    try:
        done = subprocess.run(command, cwd=cwd, env=_environment(env or {}), input=stdin,
                              capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise GitError(f"`{shown}` in {cwd}: cannot run git ({exc}) — install git and make "
                       "sure it is on PATH") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"`{shown}` in {cwd} did not finish within {timeout:g} s — is another "
                       "git command holding the repository's lock?") from None
    if check and done.returncode != 0:
        message = (done.stderr.decode(errors="replace").strip()
                   or done.stdout.decode(errors="replace").strip())[-2000:]
        raise GitError(f"`{shown}` in {cwd} failed (exit {done.returncode}): {message}",
                       first_complaint(message) or f"`{shown}` exited {done.returncode}")
    return done.stdout


def run_git(cwd: Path, *args: str, timeout: float = GIT_TIMEOUT_S, check: bool = True,
            env: Mapping[str, str] | None = None) -> str:
    """`run_git_bytes` decoded: git's stdout as text, without the final newline."""
    out = run_git_bytes(cwd, *args, timeout=timeout, check=check, env=env)
    return out.decode(errors="surrogateescape").rstrip("\n")


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


def committed_files(repo: Path, commit: str) -> dict[str, bytes]:
    """The regular files of `commit` in the repository of `repo`, by path relative to the top
    of the tree, with their contents; read from git's objects, never from the work tree."""
    listing = run_git_bytes(repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    blobs: list[tuple[str, str]] = []
    for entry in filter(None, listing.split(b"\0")):
        meta, _, name = entry.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        if kind == "blob" and mode in ("100644", "100755"):
            blobs.append((name.decode(errors="surrogateescape"), sha))
    if not blobs:
        return {}
    out = run_git_bytes(repo, "cat-file", "--batch",
                        stdin="".join(f"{sha}\n" for _, sha in blobs).encode())
    files: dict[str, bytes] = {}
    at = 0
    for path, sha in blobs:
        header_end = out.index(b"\n", at)
        found, _, size = out[at:header_end].decode().split()
        if found != sha:
            raise GitError(f"`git cat-file --batch` in {repo} answered {found} for {sha}")
        start = header_end + 1
        files[path] = out[start:start + int(size)]
        at = start + int(size) + 1
    return files


def changed_paths(repo: Path) -> tuple[str, ...]:
    """The paths in the work tree `repo` that differ from its HEAD: modified, added, deleted
    and untracked files (not ignored ones). Writes nothing, not even the index."""
    out = run_git_bytes(repo, "status", "--porcelain", "-z", "--untracked-files=all")
    entries = iter(out.split(b"\0"))
    paths: list[str] = []
    for entry in entries:
        if not entry:
            continue
        paths.append(entry[3:].decode(errors="surrogateescape"))
        if entry[:1] in (b"R", b"C"):
            next(entries, None)  # a rename or copy names its origin next
    return tuple(paths)


def work_tree_state(staging: Path) -> str:
    """A digest of what a promote takes from staging: its HEAD, and every file git would
    commit there (tracked and new, not ignored) by path, mode and contents. Reads only: no
    object and no index is written."""
    digest = hashlib.sha256(run_git(staging, "rev-parse", "HEAD").encode())
    listing = run_git_bytes(staging, "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard")
    for name in sorted(set(filter(None, listing.split(b"\0")))):
        digest.update(name + b"\0" + _file_state(staging / os.fsdecode(name)) + b"\0")
    return digest.hexdigest()


def _file_state(path: Path) -> bytes:
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            content = os.fsencode(os.readlink(path))
        else:
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
    except FileNotFoundError:
        return b"missing"
    except OSError as exc:
        return f"unreadable {exc.errno}".encode()
    return f"{info.st_mode:o} ".encode() + hashlib.sha256(content).digest()


async def is_ancestor(repo: Path, commit: str, of: str = "HEAD") -> bool:
    """Whether `commit` (a full sha) is `of` or one of its ancestors, in the repository of
    `repo`."""
    return await git(repo, "merge-base", commit, of, check=False) == commit
