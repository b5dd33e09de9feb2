"""A stand-in agent: `stand_in.py BEHAVIOUR TASK`. It prints NDJSON events like a coding
agent, and behaves as told: ok, slow (a second), fail (exit 3), malformed, error (an
is_error result), hang (starts a child that ignores SIGTERM, writes both pids to
$STAND_IN_PIDS, then sleeps), leak (prints $STAND_IN_SECRET in its output, on stderr and in
its result), leak-fail (prints it on stderr, then exits 3)."""

import json
import os
import signal
import subprocess
import sys
import time

behaviour, task = sys.argv[1], sys.argv[2]
print(json.dumps({"type": "system", "subtype": "init", "session_id": f"s-{task}"}), flush=True)
if behaviour == "slow":
    time.sleep(1)
if behaviour == "fail":
    print("agent: the model refused the request", file=sys.stderr)
    sys.exit(3)
secret = os.environ.get("STAND_IN_SECRET", "")
if behaviour.startswith("leak"):
    print(f"provider: the key {secret} was refused", file=sys.stderr, flush=True)
    if behaviour == "leak-fail":
        sys.exit(3)
    print(json.dumps({"type": "assistant", "text": f"calling with {secret}"}), flush=True)
if behaviour == "malformed":
    print("{this is not json", flush=True)
    sys.exit(0)
if behaviour in ("hang", "hang-quiet"):
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, time\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                              "time.sleep(120)\n"])
    with open(os.environ["STAND_IN_PIDS"], "w") as out:
        out.write(f"{os.getpid()} {child.pid}\n")
    if behaviour == "hang-quiet":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
print(json.dumps({"type": "assistant", "text": f"done {task}"}), flush=True)
print(json.dumps({"type": "result", "is_error": behaviour == "error",
                  "result": f"did {task}{' with ' + secret if behaviour == 'leak' else ''}"
                  if behaviour != "error" else "no access",
                  "session_id": f"s-{task}", "duration_ms": 5}), flush=True)
