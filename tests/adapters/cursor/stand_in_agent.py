"""A stand-in for Cursor's `agent` CLI in print mode: the stream-json protocol of docs/cursor.md.

The `stand_in` fixture copies this file into the test's folder as an executable named `agent`
whose shebang is the interpreter running the tests. Each run appends one JSON line to
`record.jsonl` beside it (argv, cwd, pid, and the grandchild's pid when it spawns one), then
behaves as the JSON object in `behaviour.json` beside it says:

- `mode`: "success" (init, user, assistant, a tool call, assistant, result; exit 0),
  "error" (init, user, an error on stderr, an error result when `error_result`, exit
  `exit_code`, default 1), "malformed" (init, then a line that is not JSON, then a result),
  "no-result" (init, user, assistant; exit 0 without a result), "hang" (a grandchild that
  sleeps, init, then sleep for ever);
- `delay_s`: seconds between events (a slow stream);
- `result`: the result text; `stderr`: a line written to stderr on success.

Only the standard library: it runs under any Python 3.11+.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BEHAVIOUR = Path(__file__).with_name("behaviour.json")
RECORD = Path(__file__).with_name("record.jsonl")


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv (None when absent)."""
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def emit(event: dict[str, Any], delay_s: float) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()
    if delay_s:
        time.sleep(delay_s)


def record(entry: dict[str, Any]) -> None:
    with RECORD.open("a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def main() -> int:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-v"]):
        print("2026.02.13-41ac335")
        return 0
    behaviour: dict[str, Any] = json.loads(BEHAVIOUR.read_text(encoding="utf-8"))
    mode = behaviour.get("mode", "success")
    delay = float(behaviour.get("delay_s", 0.0))
    session = str(uuid.uuid4())
    entry: dict[str, Any] = {"argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(),
                             "mode": mode}
    prompt = argv[-1] if argv else ""
    model = flag(argv, "--model") or "Auto"
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        entry["grandchild"] = child.pid
    record(entry)
    emit({"type": "system", "subtype": "init", "apiKeySource": "env", "cwd": os.getcwd(),
          "session_id": session, "model": model, "permissionMode": "default"}, delay)
    if mode == "hang":
        while True:
            time.sleep(60)
    emit({"type": "user", "message": {"role": "user", "content": [
        {"type": "text", "text": prompt}]}, "session_id": session}, delay)
    if mode == "malformed":
        sys.stdout.write('{"type": "assistant", "message": {"role": "assis\n')
        sys.stdout.flush()
    if mode == "error":
        if behaviour.get("error_result"):
            emit({"type": "result", "subtype": "error", "is_error": True, "duration_ms": 12,
                  "duration_api_ms": 12, "result": "the model refused",
                  "session_id": session}, 0)
        sys.stderr.write("Error: stand-in failure on demand\n")
        return int(behaviour.get("exit_code", 1))
    text = str(behaviour.get("result", "Done: the change is made."))
    emit({"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "text", "text": "Reading the file."}]}, "session_id": session,
        "model_call_id": "m-1"}, delay)
    call = {"readToolCall": {"args": {"path": "README.md"}}}
    emit({"type": "tool_call", "subtype": "started", "call_id": "c-1", "tool_call": call,
          "session_id": session}, delay)
    done = {"readToolCall": {"args": {"path": "README.md"},
                             "result": {"success": {"content": "hello"}}}}
    emit({"type": "tool_call", "subtype": "completed", "call_id": "c-1", "tool_call": done,
          "session_id": session}, delay)
    emit({"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "text", "text": text}]}, "session_id": session}, delay)
    if mode == "no-result":
        return 0
    if behaviour.get("stderr"):
        sys.stderr.write(str(behaviour["stderr"]) + "\n")
    emit({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 1234,
          "duration_api_ms": 1200, "result": text, "session_id": session,
          "request_id": "r-1"}, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
